"""Corpus files -> the texts in them, each with where it came from (file, record, key, line).

One reader per format (`formats.py` picks it). A reader yields `Piece`s: a text to screen, or
the reason one was not screened (``too_short``, ``huge``, ``binary``, ``undecodable``,
``malformed``); it raises `Skip` when the whole file is unusable before any text came out,
and counts the documents it read (a whole file, or one record of a JSONL / JSON array /
parquet / Arrow shard) in ``counts["documents"]``.

Structured files are read for every string they hold, not one configured field: JSON and
JSONL by walking every value (key path kept), notebooks cell by cell, markdown as its fenced
blocks plus the prose around them, parquet and Arrow by their text-like string columns.
Archives (tar, zip) member by member, each member read as the file it holds (its pieces name
it ``archive!member``), archives inside archives too, up to `MAX_ARCHIVE_DEPTH`.
"""

from __future__ import annotations

import functools
import io
import json
import lzma
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from leakray.screen import formats as F
from leakray.screen.archives import ARCHIVE_ERRORS, members
from leakray.screen.locations import open_input
from leakray.storage import is_uri

SNIFF_MIN_CHARS = 32  # a sniffed parquet/Arrow string column is screened if its values average this long
MAX_ARCHIVE_DEPTH = 3  # an archive in an archive in an archive is read; one more level is counted, not read
# a file or stream that breaks (mid-file too): OS, gzip/bz2 (OSError, EOFError), zlib, xz, JSON, pyarrow
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError, pa.ArrowException)
BATCH_ROWS = 512
FENCE_RE = re.compile(rb"^ {0,3}(`{3,}|~{3,})([^\n]*)$", re.M)


class Skip(Exception):
    """The whole file is unusable; the argument is the reason."""

    @property
    def reason(self) -> str:
        return self.args[0]


@dataclass(slots=True)
class Piece:
    data: bytes | None  # UTF-8, checked; None when `reason` says why not
    reason: str | None
    file: str
    record: int | None = None  # JSONL line (1-based); JSON / parquet / Arrow row (0-based); None: the file
    key: str = ""  # JSON key path, column, notebook cell, markdown fence; "" for a whole file
    line: int | None = 1  # line of the file where the text starts (None where the format has no lines)
    inline: bool = False  # the text was one escaped string on that line (JSONL): its line breaks are not the file's

    @property
    def ident(self) -> str:
        out = self.file if self.record is None else f"{self.file}:{self.record}"
        return f"{out}#{self.key}" if self.key else out


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


class Reader:
    """Reads any corpus file into pieces under one config (the limits and columns)."""

    def __init__(self, max_text_bytes: int, max_parse_bytes: int, min_text_bytes: int, columns: tuple[str, ...] = ()):
        self.max_text, self.max_parse, self.min_text, self.columns = (max_text_bytes, max_parse_bytes,
                                                                      min_text_bytes, tuple(columns))

    def read(self, path: str, counts, fmt: str | None = None, compression: str | None = None) -> Iterator[Piece]:
        if fmt is None:
            fmt, compression = F.detect(path)
        if fmt == "binary":
            raise Skip("binary")
        if fmt == "code" or fmt == "text":
            yield from self._whole(path, compression, counts)
        elif fmt in ("jsonl", "parquet", "arrow"):
            yield from getattr(self, "_" + fmt)(path, compression, counts)
        elif fmt in F.ARCHIVES:
            yield from self._archive(path, fmt, compression, counts)
        else:  # json, notebook, markdown, unknown: one bounded read, then parse (or sniff)
            limit = self._limit(fmt)
            try:
                data = F.read_bounded(path, compression, limit)
            except (OSError, EOFError, ValueError) as exc:
                raise Skip("unreadable") from exc
            if len(data) > limit:
                raise Skip("huge")
            yield from self._parsed(path, fmt, data, counts)

    def _limit(self, fmt: str) -> int:
        """The bytes a file of ``fmt`` may hold in memory: a text's limit, or a document's to parse."""
        return self.max_text if fmt in F.WHOLE_TEXT else self.max_parse

    def _parsed(self, path, fmt: str, data: bytes, counts) -> Iterator[Piece]:
        """A file of ``fmt`` read whole into ``data`` (an unknown format sniffed from its first bytes)."""
        if fmt == "unknown":
            fmt = F.sniff(data[:F.SNIFF_BYTES])
            if fmt == "binary":
                raise Skip("binary")
        if fmt in ("code", "text"):
            yield from self._text(path, data, counts)
        elif fmt == "jsonl":
            yield from self._jsonl_lines(path, data.split(b"\n"), counts)
        else:  # json, notebook, markdown
            yield from getattr(self, "_" + fmt)(path, data, counts)

    # ------------------------------------------------------------------ archives

    def _archive(self, path, fmt: str, compression, counts, source=None, depth: int = 1) -> Iterator[Piece]:
        """Every member of a tar or zip as the file it holds. A member that cannot be screened
        (binary, huge, a link, a nested archive too deep) is a piece with its reason, so the
        summary counts it under texts; an archive that breaks midway keeps what it gave (the
        screener counts the file truncated). ``source``: the archive's bytes, when it is itself
        a member."""
        try:
            if source is None and fmt == "zip" and compression is None:
                fh = open_input(path, seekable=True, whole_below=self.max_parse)  # a zip seeks to its directory
            else:
                fh = F.open_binary(path if source is None else io.BytesIO(source), compression)
                if fmt == "zip":  # compressed, or a member: a zip needs to seek, so it is read into memory
                    data = fh.read(self.max_parse + 1)
                    fh.close()
                    if len(data) > self.max_parse:
                        raise Skip("huge")
                    fh = io.BytesIO(data)
        except (OSError, EOFError, ValueError) as exc:
            raise Skip("unreadable") from exc
        with fh:
            try:
                for m in members(fmt, fh):
                    yield from self._member(f"{path}!{m.name}", m, counts, depth)
            except READ_ERRORS + ARCHIVE_ERRORS as exc:
                raise Skip("unreadable") from exc

    def _member(self, ident: str, m, counts, depth: int) -> Iterator[Piece]:
        if m.kind != "file":
            yield Piece(None, m.kind, ident)  # a link's target is another member, or outside the archive
            return
        fmt, compression = F.detect(m.name)
        if fmt == "binary":
            yield Piece(None, "binary", ident)
            return
        if fmt in F.ARCHIVES and depth >= MAX_ARCHIVE_DEPTH:
            yield Piece(None, "nested_too_deep", ident)
            return
        limit = self._limit(fmt)  # a shard or an archive inside is held in memory: the parse limit
        if m.size == 0:
            yield Piece(None, "empty", ident)
            return
        if m.size > limit:  # not read: its size is known from the archive's index (compressed: more unpacked)
            yield Piece(None, "huge", ident)
            return
        try:
            data = m.read(limit)
            if compression is not None:
                with F.open_binary(io.BytesIO(data), compression) as fh:
                    data = fh.read(limit + 1)
            if len(data) > limit:
                raise Skip("huge")
            if fmt in F.ARCHIVES:
                yield from self._archive(ident, fmt, None, counts, source=data, depth=depth + 1)
            elif fmt in ("parquet", "arrow"):
                yield from getattr(self, "_" + fmt)(ident, None, counts, data=data)
            else:
                yield from self._parsed(ident, fmt, data, counts)
        except Skip as exc:  # this member is unusable; the archive's other members are still read
            yield Piece(None, exc.reason, ident)
        except READ_ERRORS + ARCHIVE_ERRORS:  # this member's data is broken or encrypted: the others are read
            yield Piece(None, "unreadable", ident)

    # ------------------------------------------------------------------ whole texts

    def _whole(self, path, compression, counts) -> Iterator[Piece]:
        try:
            data = F.read_bounded(path, compression, self.max_text)
        except (OSError, EOFError, ValueError) as exc:
            raise Skip("unreadable") from exc
        yield from self._text(path, data, counts)

    def _text(self, path, data: bytes, counts) -> Iterator[Piece]:
        reason = check_bytes(data, self.max_text)
        if reason:
            raise Skip(reason)
        counts["documents"] += 1
        yield Piece(data, None, path)

    def _value(self, path, value: str, record, key, line=None) -> Piece:
        """A string found inside a record."""
        if len(value) < self.min_text:
            return Piece(None, "too_short", path, record, key, line)
        data = value.encode("utf-8", "surrogatepass")
        if len(data) > self.max_text:
            return Piece(None, "huge", path, record, key, line)
        if not data.strip():
            return Piece(None, "empty", path, record, key, line)
        return Piece(data, None, path, record, key, line)

    # ------------------------------------------------------------------ JSON

    def _strings(self, path, obj, record, prefix="") -> Iterator[Piece]:
        """Every string value under obj, with its key path (``a.b[2].c``)."""
        stack = [(prefix, obj)]
        while stack:
            key, v = stack.pop()
            if isinstance(v, str):
                yield self._value(path, v, record, key)
            elif isinstance(v, dict):
                stack.extend((f"{key}.{k}" if key else str(k), x) for k, x in reversed(list(v.items())))
            elif isinstance(v, list):
                stack.extend((f"{key}[{i}]", x) for i, x in reversed(list(enumerate(v))))

    def _json(self, path, data: bytes, counts) -> Iterator[Piece]:
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            yield from self._text(path, data, counts)  # not JSON after all: screened as text
            return
        if isinstance(obj, list):
            records = enumerate(obj)
        elif isinstance(obj, dict) and obj and all(isinstance(v, dict) for v in obj.values()):
            records = ((i, {k: v}) for i, (k, v) in enumerate(obj.items()))  # {id: record}
        else:
            counts["documents"] += 1
            yield from self._strings(path, obj, None)
            return
        for i, rec in records:
            counts["documents"] += 1
            yield from self._strings(path, rec, i)

    def _jsonl(self, path, compression, counts) -> Iterator[Piece]:
        try:
            fh = F.open_binary(path, compression)
        except OSError as exc:
            raise Skip("unreadable") from exc
        with fh:
            yield from self._jsonl_lines(path, F.iter_lines(fh), counts)

    def _jsonl_lines(self, path, lines, counts) -> Iterator[Piece]:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            counts["documents"] += 1
            try:
                rec = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                yield Piece(None, "malformed", path, lineno, "", lineno)
                continue
            for piece in self._strings(path, rec, lineno):
                piece.line, piece.inline = lineno, True
                yield piece

    # ------------------------------------------------------------------ notebooks, markdown

    def _notebook(self, path, data: bytes, counts) -> Iterator[Piece]:
        try:
            nb = json.loads(data)
            cells = nb["cells"]
        except (ValueError, UnicodeDecodeError, KeyError, TypeError):
            yield from self._json(path, data, counts)  # some other JSON, or not JSON: every string
            return
        counts["documents"] += 1
        for i, cell in enumerate(cells if isinstance(cells, list) else []):
            if not isinstance(cell, dict):
                continue
            yield self._value(path, _joined(cell.get("source")), None, f"cells[{i}].source")
            for j, out in enumerate(cell.get("outputs") or []):
                if isinstance(out, dict):
                    text = out.get("text") or (out.get("data") or {}).get("text/plain")
                    if text:
                        yield self._value(path, _joined(text), None, f"cells[{i}].outputs[{j}]")

    def _markdown(self, path, data: bytes, counts) -> Iterator[Piece]:
        """Each fenced block, then the prose with each block cut down to its line breaks (so the
        prose keeps the file's line numbers, and no block is screened twice)."""
        reason = check_bytes(data, self.max_text)
        if reason:
            raise Skip(reason)
        counts["documents"] += 1
        prose: list[bytes] = []
        pos = n = 0  # pos: where the prose not yet kept starts
        m = FENCE_RE.search(data) if b"```" in data or b"~~~" in data else None
        while m:
            fence = m.group(1)
            close = _closing_fence(fence[:1], len(fence))
            body_start = m.end() + 1
            c = close.search(data, body_start)
            body_end, after = (c.start(), c.end()) if c else (len(data), len(data))
            line = data.count(b"\n", 0, body_start) + 1
            info = m.group(2).strip().split(b" ")[0].decode("utf-8", "replace")
            key = f"fence[{n}]" + (f" {info}" if info else "")
            body = data[body_start:body_end]
            if body.strip():
                yield Piece(body, None, path, None, key, line)
            prose += [data[pos:m.start()], b"\n" * data.count(b"\n", m.start(), after)]
            pos, n = max(after, m.end() + 1), n + 1
            m = FENCE_RE.search(data, pos)
        prose.append(data[pos:])
        text = b"".join(prose)
        if text.strip():
            yield Piece(text, None, path, None, "text" if n else "", 1)

    # ------------------------------------------------------------------ parquet, Arrow

    def _parquet(self, path, compression, counts, data: bytes | None = None) -> Iterator[Piece]:
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(_arrow_source(path, compression, self.max_parse, data))
            cols = self._text_columns(pf.schema_arrow, lambda: next(pf.iter_batches(batch_size=64), None))
            batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=cols)
        except Skip:
            raise
        except Exception as exc:  # corrupt footer, not parquet: all the same to the screen
            raise Skip("unreadable") from exc
        yield from self._rows(path, cols, batches, counts)

    def _arrow(self, path, compression, counts, data: bytes | None = None) -> Iterator[Piece]:
        try:
            source = _arrow_source(path, compression, self.max_parse, data)
            try:
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:  # the streaming format (Hugging Face datasets' cache files)
                reader = pa.ipc.open_stream(_arrow_source(path, compression, self.max_parse, data))
                batches = iter(reader)
            first = []
            cols = self._text_columns(reader.schema, lambda: first.append(next(batches, None)) or first[0])
        except Skip:
            raise
        except Exception as exc:
            raise Skip("unreadable") from exc

        def all_batches():
            yield from (b for b in first if b is not None)
            yield from batches

        yield from self._rows(path, cols, (b.select(cols) for b in all_batches()), counts)

    def _text_columns(self, schema, first_batch) -> list[str]:
        """The columns named in the config that the shard has, else the string columns whose
        values in the first rows average SNIFF_MIN_CHARS or more (texts, not ids or licences)."""
        import pyarrow.compute as pc

        names = schema.names
        if self.columns:
            cols = [c for c in self.columns if c in names]
            if not cols:
                raise Skip("no_text_column")
            return cols
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        batch = first_batch() if strings else None
        if batch is None:
            raise Skip("no_text_column")
        cols = []
        for c in strings:
            lengths = pc.utf8_length(batch.column(c))
            mean = pc.mean(lengths).as_py()
            if mean is not None and mean >= SNIFF_MIN_CHARS:
                cols.append(c)
        if not cols:
            raise Skip("no_text_column")
        return cols

    def _rows(self, path, cols, batches, counts) -> Iterator[Piece]:
        row = 0
        for batch in batches:
            values = [batch.column(c).to_pylist() for c in cols]
            for r in range(batch.num_rows):
                counts["documents"] += 1
                for c, col in zip(cols, values):
                    v = col[r]
                    if isinstance(v, str):
                        yield self._value(path, v, row, c)
                row += 1


@functools.lru_cache(maxsize=64)
def _closing_fence(char: bytes, length: int) -> re.Pattern:
    """A line closing a fence opened by `length` times `char` (at least as many, nothing after)."""
    return re.compile(rb"^ {0,3}" + re.escape(char) + rb"{" + str(length).encode() + rb",}[ \t]*$", re.M)


def _joined(source) -> str:
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


def _arrow_source(path: str, compression: str | None, limit: int, data: bytes | None = None):
    """A path pyarrow reads lazily, or (compressed, or an archive's member: ``data``) the
    decompressed bytes in memory."""
    if data is not None:
        return pa.BufferReader(data)
    if compression is None:
        return open_input(path, seekable=True) if is_uri(path) else path

    data = F.read_bounded(path, compression, limit)
    if len(data) > limit:
        raise Skip("huge")
    return pa.BufferReader(data)
