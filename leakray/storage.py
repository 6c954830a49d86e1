"""Run outputs on any pyarrow filesystem: a local path, or a URI (``s3://``, ``gs://``, ``hdfs://``,
``file://``) so that the workers of a multi-node cluster write to one shared storage.

A URI run is staged on this node (under the cache, keyed by the URI) and mirrored: after every
stage its new and changed files are uploaded, completion markers last, so a marker at the URI
always means the stage's files are there. Opening the run pulls what the URI holds, markers
last as well, so a driver on another node (or a fresh one after a crash) resumes where the
last one stopped. Ray Data writes its part files and Ray Train its checkpoints straight to the
URI (`shared_dir`): those never pass through the driver's disk.

S3-compatible stores take pyarrow's URI options, e.g.
``s3://bucket/runs?endpoint_override=minio:9000&scheme=http``; credentials come from the usual
environment (``AWS_ACCESS_KEY_ID``...), never from the URI, so they never reach a report.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from leakray.errors import BadInput
from leakray.progress import PROGRESS_FILE
from leakray.runs import MARKER, cache_root, output_root

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# written once by a worker and read through the filesystem, never mirrored: Ray Data part files
_NOT_MIRRORED = ("parts",)
_TMP = re.compile(r"\.tmp\d+$")  # an atomic write in progress (`write_json_atomic`, `pull`)
_OPEN: list["RunStore"] = []  # stores of this process, for `shared_dir`
# (size, mtime_ns) of each local file as last uploaded, by absolute path: shared by the stores of
# one process, so a multi-benchmark parent does not upload its runs' files a second time
_SENT: dict[str, tuple[int, int]] = {}


def is_uri(path: str | os.PathLike) -> bool:
    return bool(_SCHEME.match(str(path)))


def display(uri: str) -> str:
    """A URI without its query string (endpoint options) or credentials, for consoles and reports."""
    parts = urlsplit(uri)
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")  # never user:secret@
    return f"{parts.scheme}://{host}{parts.path}"


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem and path for a URI; a URI pyarrow cannot open is refused in one line."""
    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise BadInput(f"cannot open output URI {display(uri)}: {exc}", field="output_dir") from exc


def join(output: str | os.PathLike, name: str) -> str:
    """``output``/``name`` for a path or a URI (before the URI's query string)."""
    if not is_uri(output):
        return str(Path(output) / name)
    parts = urlsplit(str(output))
    return parts._replace(path=f"{parts.path.rstrip('/')}/{name}").geturl()


def staging_dir(uri: str) -> Path:
    """This node's copy of a URI's tree: the same relative layout for nested runs (a multi-benchmark
    parent and its runs), so a parent's directory holds its runs' staging copies."""
    parts = urlsplit(uri)
    safe = lambda s: re.sub(r"[^A-Za-z0-9._-]", "_", s)  # noqa: E731
    host = (parts.hostname or "_") + (f"_{parts.port}" if parts.port else "")
    return cache_root() / "staging" / safe(parts.scheme) / safe(host) / \
        Path(*[safe(p) for p in parts.path.split("/") if p not in ("", ".", "..")])


def _is_marker(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] == MARKER


def _skipped(rel: str) -> bool:
    parts = rel.split("/")
    return (any(p in _NOT_MIRRORED for p in parts[:-1]) or bool(_TMP.search(parts[-1]))
            or parts[-1].startswith(PROGRESS_FILE))  # a running stage's count for its console lines: local only


class RunStore:
    """Where one run lives: ``name`` under ``output`` (or ``output`` itself when name is "").
    ``local`` is the directory every stage writes to (the run itself for a local path, its
    staging copy for a URI); ``push`` mirrors it to the URI."""

    def __init__(self, output: str | os.PathLike, name: str, pull: bool | tuple[str, ...] = True):
        """``pull``: what to fetch from the URI on opening: everything (a run about to resume), only
        these relative paths (a sweep's catalog), or nothing."""
        self.output, self.name = str(output), name
        self.fs: pafs.FileSystem | None = None
        if is_uri(output):
            self.fs, base = filesystem(self.output)
            self.remote = f"{base.rstrip('/')}/{name}" if name else base.rstrip("/")
            self.location = f"{display(self.output).rstrip('/')}/{name}" if name else display(self.output)
            self.local = staging_dir(self.output) / name
        else:
            self.remote, self.local = "", output_root(output) / name
            self.location = str(self.local)
        self.local.mkdir(parents=True, exist_ok=True)
        self.local = self.local.resolve()
        if self.fs is not None:
            self._check_writable()
            if pull:
                self.pull(None if pull is True else pull)
        _OPEN.append(self)

    @property
    def mirrored(self) -> bool:
        return self.fs is not None

    def _check_writable(self) -> None:
        try:
            self.fs.create_dir(self.remote, recursive=True)
        except OSError as exc:
            raise BadInput(f"cannot write to {self.location}: {exc}", field="output_dir") from exc

    def _remote_files(self) -> dict[str, int]:
        sel = pafs.FileSelector(self.remote, recursive=True, allow_not_found=True)
        prefix = self.remote.rstrip("/") + "/"
        return {info.path[len(prefix):]: info.size for info in self.fs.get_file_info(sel)
                if info.type == pafs.FileType.File}

    def _local_files(self) -> dict[str, Path]:
        return {p.relative_to(self.local).as_posix(): p for p in self.local.rglob("*") if p.is_file()}

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` is in the run (at the URI when mirrored: a finished run elsewhere)."""
        if not self.mirrored:
            return (self.local / rel).exists()
        return self.fs.get_file_info(f"{self.remote}/{rel}").type == pafs.FileType.File

    def pull(self, only: tuple[str, ...] | list[str] | None = None) -> int:
        """Download what the URI holds (or ``only`` these relative paths) and this staging copy
        lacks or holds at another size; markers last, so an interrupted pull never leaves a
        marker without its stage's files."""
        if not self.mirrored:
            return 0
        have = self._local_files()
        remote = self._remote_files() if only is None else {
            rel: info.size for rel, info in zip(only, self.fs.get_file_info([f"{self.remote}/{r}" for r in only]))
            if info.type == pafs.FileType.File}
        todo = [rel for rel, size in remote.items() if not _skipped(rel)
                and (rel not in have or have[rel].stat().st_size != size)]
        todo.sort(key=_is_marker)
        for rel in todo:
            dest = self.local / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
            with self.fs.open_input_stream(f"{self.remote}/{rel}") as src, open(tmp, "wb") as out:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
            os.replace(tmp, dest)
        # what matches the URI now needs no upload; anything else here (written by a driver killed
        # before its push) is still to be sent
        for rel, size in remote.items():
            path = self.local / rel
            if path.is_file() and path.stat().st_size == size:
                _SENT[str(path)] = (size, path.stat().st_mtime_ns)
        return len(todo)

    def push(self) -> int:
        """Upload new and changed files of the staging copy; markers after everything else."""
        if not self.mirrored:
            return 0
        todo = []
        for rel, path in self._local_files().items():
            if _skipped(rel):
                continue
            st = path.stat()
            if _SENT.get(str(path)) != (st.st_size, st.st_mtime_ns):
                todo.append((rel, path, (st.st_size, st.st_mtime_ns)))
        todo.sort(key=lambda item: _is_marker(item[0]))
        for rel, path, stamp in todo:
            dest = f"{self.remote}/{rel}"
            self.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
            with open(path, "rb") as src, self.fs.open_output_stream(dest) as out:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
            _SENT[str(path)] = stamp
        return len(todo)

    def shared(self, local_dir: Path) -> tuple[str, pafs.FileSystem | None]:
        """Where workers on any node write what belongs under ``local_dir`` of this run."""
        rel = Path(local_dir).resolve().relative_to(self.local.resolve()).as_posix()
        if not self.mirrored:
            return str(Path(local_dir).resolve()), None
        return f"{self.remote}/{rel}" if rel != "." else self.remote, self.fs

    def close(self) -> None:
        self.push()
        if self in _OPEN:
            _OPEN.remove(self)


def local_run_dir(output: str | os.PathLike, name: str) -> Path:
    """Where `RunStore(output, name)` puts the run on this node (without opening it)."""
    return (staging_dir(str(output)) / name).resolve() if is_uri(output) else output_root(output) / name


def store_for(local_dir: str | Path) -> "RunStore | None":
    """The open store whose run directory is ``local_dir`` (None: a local run, or none open)."""
    local_dir = Path(local_dir).resolve()
    return next((s for s in reversed(_OPEN) if s.local.resolve() == local_dir), None)


def shared_dir(local_dir: str | Path) -> tuple[str, pafs.FileSystem | None]:
    """(path, filesystem) for worker-written outputs under ``local_dir``: on the URI when the run
    that owns the directory is mirrored there, else the local path (filesystem None)."""
    local_dir = Path(local_dir).resolve()
    for store in reversed(_OPEN):
        if local_dir == store.local.resolve() or store.local.resolve() in local_dir.parents:
            return store.shared(local_dir)
    return str(local_dir), None


def ray_storage(local_dir: str | Path) -> dict:
    """`RunConfig` keyword arguments for Ray Train / Tune results under ``local_dir``: on the
    run's URI when it is mirrored (multi-node Train needs storage every worker reaches)."""
    path, filesystem_ = shared_dir(local_dir)
    return {"storage_path": path, **({"storage_filesystem": filesystem_} if filesystem_ is not None else {})}


def clear_dir(path: str, filesystem: pafs.FileSystem | None) -> None:
    """Remove a directory (a killed attempt's part files must not be read back); absent is fine."""
    fs_ = filesystem or pafs.LocalFileSystem()
    if fs_.get_file_info(path).type != pafs.FileType.NotFound:
        fs_.delete_dir(path)


def local_copy(uri: str) -> Path:
    """This node's copy of a directory at a URI (a detector card), fetched into the staging area."""
    filesystem_, path = filesystem(uri)
    if filesystem_.get_file_info(path).type != pafs.FileType.Directory:
        raise BadInput(f"no directory at {display(uri)}", field="audit.card")
    dest = staging_dir(uri)
    fetch_dir(path, filesystem_, dest)
    return dest.resolve()


def fetch_dir(remote: str, filesystem: pafs.FileSystem, local_dir: str | Path) -> None:
    """Copy a directory from shared storage to this node (a model saved by a worker elsewhere)."""
    Path(local_dir).mkdir(parents=True, exist_ok=True)
    pafs.copy_files(remote, str(Path(local_dir).resolve()), source_filesystem=filesystem,
                    destination_filesystem=pafs.LocalFileSystem())


def publish_dir(local_dir: str | Path, filesystem: pafs.FileSystem, remote: str) -> None:
    """Copy a directory written on this node to shared storage."""
    filesystem.create_dir(remote, recursive=True)
    pafs.copy_files(str(Path(local_dir).resolve()), remote, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=filesystem)
