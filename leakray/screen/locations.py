"""Where corpus files live: a local path, or a URI of any pyarrow filesystem (``s3://``,
``gs://``, ``hdfs://``, ``file://``), so a corpus kept in an object store is screened where it
is, by every worker, without a copy on the driver's disk.

A corpus URI may end in a glob (``s3://bucket/stack/**/*.jsonl.gz``) and carry pyarrow's options
in its query string (``?endpoint_override=minio:9000&scheme=http``); credentials come from the
environment, as for outputs (`leakray.storage`). Each file found is named by its own URI (the
query kept, so a worker can open it); one filesystem per store is made per process and reused.
"""

from __future__ import annotations

import functools
import io
import re
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from leakray.errors import BadInput
from leakray.storage import display, is_uri

GLOB_CHARS = re.compile(r"[*?\[]")


def glob_regex(pattern: str) -> re.Pattern:
    """A path glob as a regex, the way Python's recursive glob reads it: ``**`` any depth (none
    included), ``*`` and ``?`` within one path segment, ``[...]`` a character class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


@functools.lru_cache(maxsize=64)
def _store(scheme: str, netloc: str, query: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, the prefix that turns a URI's path into the filesystem's path) for one store
    (a bucket, a host): S3 and GCS put the bucket in front, a local filesystem keeps the path. Made
    once per process: for S3 it may ask the bucket's region over the network."""
    uri = f"{scheme}://{netloc}/_" + (f"?{query}" if query else "")
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise BadInput(f"cannot open corpus URI {display(uri)}: {exc}", field="corpus") from exc
    return fs, path[:-1]


def filesystem_path(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``uri`` and the file's path in it (the store's filesystem cached)."""
    parts = urlsplit(uri)
    fs, prefix = _store(parts.scheme, parts.netloc, parts.query)
    return fs, prefix + parts.path.lstrip("/")


def list_files(spec: str) -> list[tuple[str, int, int]]:
    """(URI, size, mtime_ns) of every file a corpus URI names: the file, everything under the
    directory, or what its glob matches (files, and everything under the directories it matches,
    as a local glob's directories are walked). Refused in one line when nothing matches."""
    parts = urlsplit(spec)
    path = parts.path
    cut = GLOB_CHARS.search(path)
    base = path if cut is None else path[: path.rfind("/", 0, cut.start()) + 1]
    fs, fs_base = filesystem_path(parts._replace(path=base or "/").geturl())
    fs_base = fs_base.rstrip("/") or fs_base  # a directory by its name, not name/ (which S3 may not list)
    try:
        info = fs.get_file_info(fs_base)
        if info.type == pafs.FileType.File and cut is None:
            found = [info]
        elif info.type == pafs.FileType.NotFound:
            found = []
        else:
            found = [i for i in fs.get_file_info(pafs.FileSelector(fs_base, recursive=True))
                     if i.type == pafs.FileType.File]
    except OSError as exc:
        raise BadInput(f"cannot list corpus URI {display(spec)}: {exc}", field="corpus") from exc
    want = glob_regex(path.rstrip("/") or path) if cut is not None else None  # "dir*/": the directories
    out = []
    for i in sorted(found, key=lambda i: i.path):
        if i.path == fs_base:  # the spec named this file
            uri_path, uri = path, spec
        else:  # the same place under the URI's path as under the filesystem's
            uri_path = base.rstrip("/") + i.path[len(fs_base.rstrip("/")):]
            uri = f"{parts.scheme}://{parts.netloc}{uri_path}" + (f"?{parts.query}" if parts.query else "")
        # as for a local glob: a file the pattern names, or one under a directory it names
        if want is None or any(want.match(uri_path[:j]) for j in _prefix_ends(uri_path)):
            out.append((uri, int(i.size or 0), i.mtime_ns if i.mtime_ns is not None else -1))
    if not out:
        raise BadInput("no corpus file matches", path=display(spec))
    return out


def _prefix_ends(path: str) -> list[int]:
    """Where ``path`` and each of its directories end (the file first)."""
    return [len(path)] + [i for i in range(len(path) - 1, 0, -1) if path[i] == "/"]


# An object store answers each read with a request: a stream is read ahead in blocks this large
# (gzip and tarfile read a few KB at a time), not one request per small read
READ_AHEAD = 4 << 20


def open_input(path: str, seekable: bool = False, whole_below: int = 0):
    """A binary file object over a corpus file: a local path, or a URI (random access where
    ``seekable``: a parquet footer, a zip's directory). A URI of at most ``whole_below`` bytes is
    read in one request and served from memory (a zip reads its members in 4 KB pieces)."""
    if not is_uri(path):
        return open(path, "rb")
    fs, fs_path = filesystem_path(path)
    if seekable:
        if whole_below and (fs.get_file_info(fs_path).size or 0) <= whole_below:
            with fs.open_input_stream(fs_path, compression=None) as fh:
                return io.BytesIO(fh.read())
        return fs.open_input_file(fs_path)
    # compression=None: pyarrow would otherwise undo a .gz by the name, which `formats` does itself
    return fs.open_input_stream(fs_path, compression=None, buffer_size=READ_AHEAD)
