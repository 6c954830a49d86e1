"""Corpus side, plain Python: what a PATH_OR_GLOB names, and turning raw files/records into
(id, bytes) documents, each bad one counted under a reason instead of crashing the run.

Reasons: ``empty`` (no non-whitespace content), ``binary`` (a NUL byte in the first 8 KiB),
``undecodable`` (not UTF-8), ``huge`` (over max_file_bytes), ``unreadable`` (OS error or a
corrupt shard), ``malformed`` (a JSONL line that is not a JSON object), ``no_content`` (a
record without a string/bytes ``content``), ``too_short`` (fewer tokens than the n-gram).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from leakray.errors import BadInput

CONTENT = "content"  # corpus record columns (The Stack / StarCoderData spelling)
ID_COLUMNS = ("id", "path", "max_stars_repo_path")

SOURCE_EXTENSIONS = frozenset(
    ".py .pyi .pyx .java .js .jsx .mjs .ts .tsx .c .h .cc .cpp .cxx .hpp .hh .cs .go .rs .rb .php "
    ".scala .kt .kts .swift .m .mm .sh .bash .jl .lua .r .pl .pm .hs .ml .fs .clj .ex .exs .erl .dart "
    ".groovy .sql .ipynb .vb .f90 .f .zig .nim .v .sv .vhd .cu .proto".split())
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
EXAMPLES_PER_REASON = 5


@dataclass
class CorpusPlan:
    files: list[tuple[str, int]] = field(default_factory=list)  # (path, size) of source files
    jsonl: list[str] = field(default_factory=list)
    parquet: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set, repr=False)

    def skip(self, reason: str, ident: str) -> None:
        self.skipped[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < EXAMPLES_PER_REASON:
            ex.append(ident)

    def fingerprint(self) -> list:
        """What identifies the corpus for the run key: paths, sizes, mtimes."""
        out = []
        for p, size in self.files:
            out.append((p, size, _mtime(p)))
        for p in self.jsonl + self.parquet:
            out.append((p, _size(p), _mtime(p)))
        return sorted(out)


def _mtime(p: str) -> int:
    try:
        return os.stat(p).st_mtime_ns
    except OSError:
        return -1


def _size(p: str) -> int:
    try:
        return os.stat(p).st_size
    except OSError:
        return -1


def _kind(path: str) -> str | None:
    low = path.lower()
    if low.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if os.path.splitext(low)[1] in SOURCE_EXTENSIONS:
        return "files"
    return None


def plan_corpus(spec: str, max_file_bytes: int, extensions: frozenset[str] = SOURCE_EXTENSIONS) -> CorpusPlan:
    """Resolve a directory (recursively: source files by extension; JSONL/parquet shards too),
    a single file, or a glob into the files to read. Empty and huge source files are skipped here."""
    plan = CorpusPlan()
    if os.path.isdir(spec) or os.path.isfile(spec):
        roots = [spec]
    else:
        roots = sorted(glob.glob(spec, recursive=True))
        if not roots:
            raise BadInput("no corpus file matches", path=spec)
    for root in roots:
        if os.path.isdir(root):
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    _add(plan, os.path.join(dirpath, name), max_file_bytes, extensions, explicit=False)
        else:
            _add(plan, root, max_file_bytes, extensions, explicit=root == spec)  # named, not globbed
    return plan


def _add(plan: CorpusPlan, path: str, max_bytes: int, extensions, explicit: bool) -> None:
    real = os.path.realpath(path)
    if real in plan.seen:  # a glob and a directory naming the same file, or a symlink: screen it once
        return
    plan.seen.add(real)
    kind = _kind(path)
    if kind == "files" and os.path.splitext(path.lower())[1] not in extensions:
        kind = None
    if kind is None:
        if explicit:  # a file named on purpose is screened whatever its extension
            kind = "files"
        else:
            return
    if kind == "jsonl":
        plan.jsonl.append(path)
    elif kind == "parquet":
        plan.parquet.append(path)
    else:
        try:
            st = os.stat(path)
        except OSError:
            plan.skip("unreadable", path)
            return
        if not os.path.isfile(path):
            return
        if st.st_size == 0:
            plan.skip("empty", path)
        elif st.st_size > max_bytes:
            plan.skip("huge", path)
        else:
            plan.files.append((path, st.st_size))


def check_bytes(data: bytes, max_bytes: int) -> str | None:
    """Why this content cannot be screened, or None if it can."""
    if len(data) > max_bytes:
        return "huge"
    if not data.strip():
        return "empty"
    if b"\x00" in data[:8192]:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "undecodable"
    return None


def read_source_file(path: str, max_bytes: int) -> tuple[bytes | None, str | None]:
    """Read at most max_bytes + 1 bytes (so a file that grew stays bounded in memory)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError:
        return None, "unreadable"
    reason = check_bytes(data, max_bytes)
    return (None, reason) if reason else (data, None)


def content_bytes(value, max_bytes: int) -> tuple[bytes | None, str | None]:
    """A record's content (str or bytes) as screenable UTF-8 bytes, or the reason it is not."""
    if isinstance(value, str):
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError:
            return None, "undecodable"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        return None, "no_content"
    reason = check_bytes(data, max_bytes)
    return (None, reason) if reason else (data, None)


def record_id(rec: dict, fallback: str) -> str:
    for col in ID_COLUMNS:
        v = rec.get(col)
        if v is not None and str(v):
            return str(v)
    return fallback


def iter_jsonl_documents(path: str, max_bytes: int) -> Iterator[tuple[str, bytes | None, str | None]]:
    """(id, content bytes or None, skip reason) per line of a JSONL(.gz) shard, streaming.
    A shard that cannot be opened or stops decoding yields one ('path', None, 'unreadable')."""
    try:
        opener = gzip.open if path.lower().endswith(".gz") else open
        with opener(path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                ident = f"{path}:{lineno}"
                try:
                    rec = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    yield ident, None, "malformed"
                    continue
                if not isinstance(rec, dict):
                    yield ident, None, "malformed"
                    continue
                data, reason = content_bytes(rec.get(CONTENT), max_bytes)
                yield record_id(rec, ident), data, reason
    except (OSError, EOFError, gzip.BadGzipFile):
        yield path, None, "unreadable"


def parquet_columns(path: str) -> tuple[list[str] | None, str | None]:
    """Columns to read from a parquet shard (content + an id column), or why it is unusable."""
    try:
        import pyarrow.parquet as pq

        names = pq.ParquetFile(path).schema_arrow.names
    except Exception:  # corrupt footer, not parquet, unreadable: all the same to the screen
        return None, "unreadable"
    if CONTENT not in names:
        return None, "no_content"
    return [CONTENT] + [c for c in ID_COLUMNS if c in names][:1], None
