"""Which reader a corpus file gets: by extension (under an optional compression suffix), else by
sniffing its first bytes; and opening a file through its compression.

Formats: ``code`` (one text per file), ``text`` (the same, for prose), ``markdown`` (fenced
blocks and the prose around them), ``notebook`` (cells), ``json`` (every string of a document),
``jsonl`` (every string of every line, streamed), ``parquet`` / ``arrow`` (string columns,
streamed), ``tar`` / ``zip`` (archives: each member read as the file it holds, `archives.py`),
``binary`` (skipped by extension, not read), ``unknown`` (sniffed when read).
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
from collections.abc import Iterator
from urllib.parse import urlsplit

from leakray.screen.locations import open_input
from leakray.storage import is_uri

CODE_EXTENSIONS = frozenset(
    ".py .pyi .pyx .pxd .java .js .jsx .mjs .cjs .ts .tsx .c .h .cc .cpp .cxx .hpp .hh .cs .go .rs .rb .php "
    ".scala .kt .kts .swift .m .mm .sh .bash .zsh .jl .lua .r .pl .pm .hs .ml .fs .clj .ex .exs .erl .dart "
    ".groovy .sql .vb .f90 .f .zig .nim .v .sv .vhd .cu .proto".split())
TEXT_EXTENSIONS = frozenset(
    ".txt .text .rst .adoc .tex .org .csv .tsv .log .cfg .ini .toml .yaml .yml .xml .html .htm .css .scss "
    ".diff .patch .in .conf .properties .gradle .cmake .mk .dockerfile .svg".split())
MARKDOWN_EXTENSIONS = frozenset(".md .markdown .mdx .rmd .qmd".split())
BINARY_EXTENSIONS = frozenset(
    ".png .jpg .jpeg .gif .bmp .ico .webp .tif .tiff .pdf .7z .rar .so .dll .dylib .exe "
    ".bin .pyc .pyo .pyd .class .o .a .lib .obj .woff .woff2 .ttf .otf .eot .mp3 .mp4 .wav .ogg .flac .avi "
    ".mov .mkv .npy .npz .pkl .pickle .pt .pth .ckpt .safetensors .h5 .hdf5 .onnx .db .sqlite .sqlite3 .xlsx .xls "
    ".docx .doc .pptx .ppt .odt .dat .idx .pack".split())
BY_EXTENSION = {
    **{e: "code" for e in CODE_EXTENSIONS}, **{e: "text" for e in TEXT_EXTENSIONS},
    **{e: "markdown" for e in MARKDOWN_EXTENSIONS}, **{e: "binary" for e in BINARY_EXTENSIONS},
    ".ipynb": "notebook", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".jsonlines": "jsonl",
    ".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".tar": "tar", ".zip": "zip",
    # zips by another name: a wheel or egg holds a package's sources, a jar its classes (skipped as
    # binary members) and, for a -sources.jar, its Java sources
    ".whl": "zip", ".egg": "zip", ".jar": "zip",
}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
# a tar under its compression's short name (a repository's release tarball: .tgz)
TAR_SHORTHANDS = {".tgz": "gzip", ".taz": "gzip", ".tbz": "bz2", ".tbz2": "bz2", ".txz": "xz", ".tzst": "zstd"}
ARCHIVES = frozenset({"tar", "zip"})
# read record by record, or member by member: no whole-file size limit
STREAMED = frozenset({"jsonl", "parquet", "arrow"}) | ARCHIVES
WHOLE_TEXT = frozenset({"code", "text", "markdown"})  # one read of the file, up to max_file_bytes
SNIFF_BYTES = 8192


def detect(path: str) -> tuple[str, str | None]:
    """(format, compression) from the file name alone (a URI's path, its query string left out)."""
    if is_uri(path):
        path = urlsplit(path).path
    name = os.path.basename(path).lower()
    stem, ext = os.path.splitext(name)
    if ext in TAR_SHORTHANDS:
        return "tar", TAR_SHORTHANDS[ext]
    compression = COMPRESSIONS.get(ext)
    if compression:
        stem, ext = os.path.splitext(stem)
    if not ext and stem in ("makefile", "dockerfile", "license", "readme", "changelog", "notice", "authors"):
        return "text", compression
    return BY_EXTENSION.get(ext, "unknown"), compression


def sniff(head: bytes) -> str:
    """The format of a file named by no known extension, from its first bytes: binary (a NUL
    byte, or not UTF-8), JSON / JSON lines (an object or array that parses), else text."""
    if b"\x00" in head:
        return "binary"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut at the end of the window
            return "binary"
    lead = head.lstrip()[:1]
    if lead in (b"{", b"["):
        first = head.lstrip().split(b"\n", 1)[0]
        try:
            json.loads(first)
            return "jsonl" if lead == b"{" and b"\n" in head.strip() else "json"
        except ValueError:
            return "json"
    return "text"


def open_binary(path, compression: str | None):
    """A binary file object over the decompressed bytes of a file (a path, a filesystem URI, or a
    binary file object: an archive's member held in memory)."""
    if isinstance(path, str) and is_uri(path):
        path = open_input(path)
    if compression is None:
        return open(path, "rb") if isinstance(path, (str, os.PathLike)) else path
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "bz2":
        return bz2.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    import pyarrow as pa  # zstd through pyarrow's codec: no extra dependency

    return pa.input_stream(path, compression="zstd")  # a path or a file object alike


def read_bounded(path: str, compression: str | None, limit: int) -> bytes:
    """At most limit + 1 decompressed bytes (a caller seeing more knows the file is too big)."""
    with open_binary(path, compression) as fh:
        return fh.read(limit + 1)


def iter_lines(fh, block: int = 1 << 20) -> Iterator[bytes]:
    """Lines of a binary stream (any stream with read(n): pyarrow's compressed streams included)."""
    rest = b""
    while True:
        chunk = fh.read(block)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest
