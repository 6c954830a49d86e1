"""The members of a tar or zip archive, one at a time, never written to disk.

A repository snapshot, a release tarball or a dataset's zip holds the files a leak hides in;
the readers screen each member as the file it would be once unpacked (`readers.Reader`). Tar
archives are read as a stream (`tarfile`'s ``r|`` mode, under the file's own compression), so a
tarball of any size costs one member in memory at a time; a zip needs its central directory,
so it is read from the file (or, nested or compressed, from memory). A member's bytes are read
up to a limit the caller gives: a member larger than that is never read (its size is known
first), and a member that claims less but inflates beyond it is cut at limit + 1 bytes."""

from __future__ import annotations

import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# A broken archive, at its start or midway: the reader counts the file unreadable (or truncated)
ARCHIVE_ERRORS = (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, NotImplementedError)


@dataclass
class Member:
    name: str
    size: int  # bytes as stored unpacked (a zip's header says so; a tar's is exact)
    kind: str  # "file", "link" (symbolic or hard), "other" (device, fifo)
    read: Callable[[int], bytes]  # at most limit + 1 bytes; only while this member is current


def tar_members(fileobj) -> Iterator[Member]:
    """Members of a tar stream in archive order (directories left out). ``fileobj`` needs only
    ``read``: the file's compression is undone by the caller (`formats.open_binary`)."""
    with tarfile.open(fileobj=fileobj, mode="r|") as tf:
        for info in tf:
            if info.isdir():
                continue
            kind = "file" if info.isfile() else "link" if (info.issym() or info.islnk()) else "other"

            def read(limit: int, info=info) -> bytes:
                fh = tf.extractfile(info)
                return fh.read(limit + 1) if fh is not None else b""

            yield Member(info.name, info.size, kind, read)


def zip_members(fileobj) -> Iterator[Member]:
    """Members of a zip in its central directory's order (directories left out). An encrypted
    member raises RuntimeError when read; a member whose data fails its CRC raises BadZipFile."""
    with zipfile.ZipFile(fileobj) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            # the Unix mode where the archiver kept one; its file-type bits may be absent (Python's
            # writestr keeps only the permissions): no type is a regular file
            ftype = stat.S_IFMT(info.external_attr >> 16)
            kind = "link" if ftype == stat.S_IFLNK else "file" if ftype in (0, stat.S_IFREG) else "other"

            def read(limit: int, info=info) -> bytes:
                with zf.open(info) as fh:
                    return fh.read(limit + 1)

            yield Member(info.filename, info.file_size, kind, read)


def members(fmt: str, fileobj) -> Iterator[Member]:
    """``fmt``: "tar" or "zip" (`formats.detect`)."""
    return tar_members(fileobj) if fmt == "tar" else zip_members(fileobj)
