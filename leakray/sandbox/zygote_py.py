"""A warm worker inside one bubblewrap sandbox: `python -I zygote_py.py` (root inside, no network).

Why: a fresh interpreter costs ~25 ms of `site` and imports per run; a fork of a warm one costs
~1 ms. The `python` runner forks twice (the program's worker, then its judge: see harness_py). Each request is judged in a forked child that, before any untrusted code runs, gets its
own session, rlimits, a private 0700 work dir, a scrubbed environment, /dev/null as stdin, only
fds 0-3, and the slot's unprivileged uid with no capabilities and no_new_privs. When the child
is done (or its wall clock runs out) every process of that uid is killed and the work dir wiped,
so nothing of one run survives into the next. The zygote itself is root in the sandbox: a run
cannot signal it, read its memory, or reach its request pipe.

Frames on stdin/stdout: 4-byte big-endian length + JSON. A request comes as two frames, the run
and then its token: for the `python` runner the program's worker is forked in between, so its
memory never held the token (frames are read with exact-length `os.read`, never buffered ahead).
"""

import ctypes
import fcntl
import json
import os
import posix
import resource
import select
import shutil
import signal
import struct
import sys
import time

sys.path[0] = os.path.dirname(os.path.abspath(__file__))
import guard_py  # noqa: E402,F401  (next to this file; preloaded for the in-process runners)
import harness_py  # noqa: E402
import split_py  # noqa: E402

PRELOAD = ("unittest", "pytest", "math", "re", "collections", "itertools", "functools", "heapq", "string",
           "typing", "fractions", "decimal", "bisect", "datetime", "json", "random", "statistics", "copy",
           "hashlib", "operator", "dataclasses", "numpy")
PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 38, 36
_libc = ctypes.CDLL(None, use_errno=True)
_STATE = {"secret_read": False}
_KILL_ALL = (posix.kill, -1, signal.SIGKILL)  # bound now: as the run's uid, before its verdict


def _read_exact(fd: int, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _read_frame(fd: int):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def _write_frame(fh, obj) -> None:
    data = json.dumps(obj).encode()
    fh.write(struct.pack(">I", len(data)) + data)
    fh.flush()


def _kill_uid(uid: int) -> None:
    # core._kill_uid's twin: this file runs inside the sandbox on the stdlib alone (`python -I`),
    # so it cannot import leakray.
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _uid_alive(uid: int) -> bool:
    """Whether any live (not zombie) process of `uid` exists in this pid namespace. A process that
    could still fork is itself listed, so an empty answer stays true: no fork needed to kill."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            if state not in (b"Z", b"X") and os.stat(f"/proc/{pid}").st_uid == uid:
                return True
        except (OSError, IndexError):
            continue
    return False


def _reap() -> None:
    """Wait for every process the run left (all SIGKILLed, reparented to us as subreaper): their
    zombies would otherwise count against the next run's process limit."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _tail(path: str, n: int) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - n))
        return fh.read().decode("latin-1")


def _enter(req: dict, wd: str, out: int, err: int, chan: int | None, stdin: int, keep=()) -> None:
    """Between fork and the program: everything that must hold before untrusted code runs.
    fds after it: 0-2, the channel on 3 (when given), then `keep` from 4 on; nothing else."""
    os.setsid()
    keep = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in keep]  # out of the way of the dup2s below
    for src, dst in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(src, dst)
    if chan is not None:
        os.dup2(chan, 3)
    else:  # the worker: no channel, and fd 3 is not left free for anything to land on
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 3)
        os.close(null)
    for k, fd in enumerate(keep):
        os.dup2(fd, 4 + k, inheritable=False)
    os.closerange(4 + len(keep), 1 << 16)  # the request pipe above all: it carries the next run's token
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # not the request pipe's wrapper
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    cpu = int(req["cpu_s"]) + 1
    for what, value in ((resource.RLIMIT_AS, req["memory_mb"] << 20), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                        (resource.RLIMIT_FSIZE, req["fsize"]), (resource.RLIMIT_CORE, 0),
                        (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_NPROC, req["max_procs"])):
        resource.setrlimit(what, value if isinstance(value, tuple) else (value, value))
    os.chdir(wd)
    os.environ.clear()
    os.environ.update(req["env"], HOME=wd, TMPDIR=wd)
    uid = req["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to non-root: every capability is gone
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os._exit(70)
    if os.getuid() != uid or os.geteuid() != uid:
        os._exit(70)
    sys.argv = [os.path.join(wd, "solution.py")]


def _child(req: dict, wd: str, out: int, err: int, chan: int, stdin: int, secret: dict, link=()) -> None:
    """`secret` is the token frame's dict: the harness empties it, so that no frame of this
    process's main thread (where signal handlers run) still holds the token."""
    try:
        _enter(req, wd, out, err, chan, stdin, link)
        if req["mode"] == "stdio":
            secret.clear()
            harness_py.stdio_main(os.path.join(wd, "solution.py"))
        if req["mode"] == "python":
            harness_py.judge_split(secret.pop("token").encode(), 3, (4, 5), _KILL_ALL)
        harness_py.judge(req["mode"], secret, 3, _KILL_ALL)
    finally:
        os._exit(71)


def _worker(req: dict, wd: str, out: int, err: int, stdin: int, link) -> None:
    """The `python` runner's program process: forked before the token was read, no channel."""
    try:
        _enter(req, wd, out, err, None, stdin, link)
        split_py.worker_main(4, 5)
    finally:
        os._exit(71)


def serve_one(req: dict, n: int, rfd: int) -> dict:
    uid = req["uid"]
    wd = f"/tmp/w{n}"
    os.mkdir(wd, 0o700)
    for name, text in req["files"].items():
        with open(os.path.join(wd, name), "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chown(os.path.join(wd, name), uid, uid)
    os.chown(wd, uid, uid)
    private = "/tmp/.z"  # root-only: the run writes these through its fds, never opens them
    paths = [os.path.join(private, f"{n}.{k}") for k in ("out", "err", "chan")]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for p in paths]
    stdin_path = os.path.join(private, f"{n}.in")
    with open(stdin_path, "w", encoding="utf-8") as fh:
        fh.write(req.get("stdin") or "")
    fds.append(os.open(stdin_path, os.O_RDONLY))
    os.unlink(stdin_path)
    start = time.monotonic()
    judge_link, opened = (), []
    if req["mode"] == "python":
        worker_rd, judge_wr = os.pipe()  # requests
        judge_rd, worker_wr = os.pipe()  # replies
        opened = [worker_rd, judge_wr, judge_rd, worker_wr]
        if os.fork() == 0:
            _worker(req, wd, fds[0], fds[1], fds[3], (worker_rd, worker_wr))
        judge_link = (judge_rd, judge_wr)
    _STATE["secret_read"] = True
    secret = _read_frame(rfd)  # only now: the worker's memory never held it
    if not isinstance(secret, dict) or not isinstance(secret.get("token"), str):
        raise ValueError("no token frame")
    pid = os.fork()
    if pid == 0:
        _child(req, wd, *fds, secret, judge_link)
    for fd in fds + opened:
        os.close(fd)
    timed_out, status, usage = False, 0, None
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(int(req["wall_s"] * 1000)):
            timed_out = True
            _kill_uid(uid)
        _, status, usage = os.wait4(pid, 0)
    finally:
        os.close(pidfd)
    duration = time.monotonic() - start
    # stragglers: daemons, double forks, anything the uid still owns. The harness already did
    # kill(-1) as the uid before it reported; the fork that does it again is for when it did not
    if _uid_alive(uid):
        _kill_uid(uid)
    _reap()
    rc = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime if usage else 0.0
    if rc in (-signal.SIGXCPU, -signal.SIGKILL) and cpu >= int(req["cpu_s"]) + 1:
        timed_out = True
    res = {"rc": rc, "timed_out": timed_out, "duration": duration,
           "stdout": _tail(paths[0], req["tail"]), "stderr": _tail(paths[1], 65536),
           "channel": _tail(paths[2], 65536)}
    for p in paths:
        os.unlink(p)
    shutil.rmtree(wd, ignore_errors=True)
    return res


def main() -> None:
    for name in PRELOAD:  # shared, copy-on-write, by every run's fork
        try:
            __import__(name)
        except Exception:
            pass
    guard_py.trusted_roots()  # computed once here, not in every forked run
    import gc
    gc.freeze()  # the preloaded heap out of the collector's sight: a run's GC would copy every page of it
    guard_py._CACHE["flags_offset"] = guard_py._flags_offset(ctypes, type("Probe", (), {}))
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of a run come back here to be reaped
    os.mkdir("/tmp/.z", 0o700)
    os.chmod("/tmp", 0o755)  # runs write only in their own dir
    rfd, wfile = sys.stdin.fileno(), sys.stdout.buffer
    sys.stdout = sys.stderr
    n = 0
    while True:
        req = _read_frame(rfd)
        if req is None:
            return
        n += 1
        _STATE["secret_read"] = False
        try:
            res = serve_one(req, n, rfd)
        except Exception as exc:  # a zygote fault is the harness's `error`, never a pass
            if not _STATE["secret_read"]:
                _read_frame(rfd)  # the token frame, so the next request starts on a frame boundary
            shutil.rmtree(f"/tmp/w{n}", ignore_errors=True)
            res = {"rc": -1, "timed_out": False, "duration": 0.0, "stdout": "", "channel": "", "fault": True,
                   "stderr": f"zygote: {type(exc).__name__}: {exc}"}
        _write_frame(wfile, res)


if __name__ == "__main__":
    main()
