"""Corpus side, plain Python: what a PATH_OR_GLOB names. Every file found is planned for
reading or counted as skipped with its reason, never dropped without a trace.

File reasons: ``empty`` (no bytes, or only whitespace), ``binary`` (a binary extension, a NUL
byte, or not UTF-8 where text was expected), ``huge`` (over max_file_bytes for a code/text
file, over max_parse_bytes for a JSON document or notebook), ``unreadable`` (OS error, corrupt
shard or compression), ``no_text_column`` (a parquet/Arrow shard with no text-like string
column), ``no_text`` (read, but nothing in it long enough to screen). Text and record reasons
(``too_short``, ``malformed``, ...) are counted apart, under ``texts``.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from dataclasses import dataclass, field

from leakray.errors import BadInput
from leakray.screen import formats as F
from leakray.screen.locations import list_files
from leakray.screen.readers import check_bytes
from leakray.storage import is_uri

EXAMPLES_PER_REASON = 5
SHARD_BYTES = 8 << 20  # a file this big is read alone (one work item), not batched with small files


@dataclass
class CorpusPlan:
    files: list[tuple[str, int]] = field(default_factory=list)  # (path, size): small files, read in batches
    shards: list[tuple[str, int]] = field(default_factory=list)  # big or record-streamed files, one per item
    formats: Counter = field(default_factory=Counter)  # files per format (planned and skipped)
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set, repr=False)
    mtimes: dict[str, int] = field(default_factory=dict, repr=False)  # a URI's, from its listing

    def skip(self, reason: str, ident: str) -> None:
        self.skipped[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < EXAMPLES_PER_REASON:
            ex.append(ident)

    @property
    def n_files(self) -> int:
        return len(self.files) + len(self.shards) + sum(self.skipped.values())

    def fingerprint(self) -> list:
        """What identifies the corpus for the run key: paths, sizes, mtimes."""
        return sorted((p, size, self.mtimes[p] if p in self.mtimes else _mtime(p)) for p, size in self.files + self.shards)


def _mtime(p: str) -> int:
    try:
        return os.stat(p).st_mtime_ns
    except OSError:
        return -1


def plan_corpus(spec: str, max_file_bytes: int, max_parse_bytes: int | None = None) -> CorpusPlan:
    """Resolve a directory (recursively), a single file, or a glob into the files to read; the
    same for a filesystem URI (`locations.list_files`). Empty files, binary extensions and
    code/text files over max_file_bytes are skipped here."""
    plan = CorpusPlan()
    if is_uri(spec):
        for uri, size, mtime in list_files(spec):
            plan.mtimes[uri] = mtime
            _classify(plan, uri, size, max_file_bytes, max_parse_bytes or max_file_bytes)
        return plan
    if os.path.isdir(spec) or os.path.isfile(spec):
        roots = [spec]
    else:
        # lexists: glob("missing/**", recursive=True) returns ["missing/"], a path that is not there
        roots = sorted(r for r in glob.glob(spec, recursive=True) if os.path.lexists(r))
        if not roots:
            raise BadInput("no corpus file matches", path=spec)
    for root in roots:
        if os.path.isdir(root):
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(filenames):
                    _add(plan, os.path.join(dirpath, name), max_file_bytes, max_parse_bytes or max_file_bytes)
        else:
            _add(plan, root, max_file_bytes, max_parse_bytes or max_file_bytes)
    return plan


def screenable_plan(spec: str, max_file_bytes: int, max_parse_bytes: int | None = None) -> CorpusPlan:
    """`plan_corpus`, refusing a corpus of which every file is skipped before reading (binary,
    empty, huge, unreadable): a leak ratio of 0% from it would say nothing about the benchmark."""
    plan = plan_corpus(spec, max_file_bytes, max_parse_bytes)
    if not plan.files and not plan.shards:
        why = ", ".join(f"{k} {v}" for k, v in sorted(plan.skipped.items(), key=lambda kv: -kv[1]))
        examples = "; ".join(f"{k}: {', '.join(v)}" for k, v in plan.examples.items())
        raise BadInput(f"nothing in the corpus can be screened: {plan.n_files} files, every one skipped ({why}; "
                       f"e.g. {examples})", path=spec)
    return plan


def _add(plan: CorpusPlan, path: str, max_bytes: int, max_parse: int) -> None:
    real = os.path.realpath(path)
    if real in plan.seen:  # a glob and a directory naming the same file, or a symlink: screen it once
        return
    plan.seen.add(real)
    try:
        st = os.stat(path)
        readable = os.path.isfile(path)  # not a socket, a device, a dangling link
    except OSError:
        readable = False
    _classify(plan, path, st.st_size if readable else -1, max_bytes, max_parse)


def _classify(plan: CorpusPlan, path: str, size: int, max_bytes: int, max_parse: int) -> None:
    """A file by its name and size (-1: it cannot be read): skipped here, read in batches, or
    read alone."""
    fmt, compression = F.detect(path)
    plan.formats[fmt + (f"+{compression}" if compression else "")] += 1
    if size < 0:
        plan.skip("unreadable", path)
    elif size == 0:
        plan.skip("empty", path)
    elif fmt == "binary":
        plan.skip("binary", path)
    elif fmt in F.WHOLE_TEXT and compression is None and size > max_bytes:
        plan.skip("huge", path)
    elif fmt in ("json", "notebook") and compression is None and size > max_parse:
        plan.skip("huge", path)
    elif fmt in F.STREAMED or compression is not None or size > SHARD_BYTES:
        plan.shards.append((path, size))
    else:
        plan.files.append((path, size))


def read_source_file(path: str, max_bytes: int) -> tuple[bytes | None, str | None]:
    """One file's bytes, or why they cannot be screened; reads at most max_bytes + 1 bytes (so a
    file that grew stays bounded in memory)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError:
        return None, "unreadable"
    reason = check_bytes(data, max_bytes)
    return (None, reason) if reason else (data, None)
