"""The process-level wall around one run: namespaces (bubblewrap), rlimits and an unprivileged uid.

Layers, outermost first:
- bubblewrap: new user/pid/net/ipc/uts namespaces, `/` read-only, a size-capped tmpfs as the only
  writable place (`/tmp`, also the cwd and $HOME), `/root`, `/home`, `/run` hidden, fresh `/proc`,
  minimal `/dev`, empty environment. The pid namespace dies with its init, so killing bwrap kills
  every descendant.
- rlimits (address space, CPU, processes, file size, no core dumps, open files).
- when we are root, a uid of its own per concurrent run: RLIMIT_NPROC is never enforced for root,
  and a fresh uid makes the process limit count this run's processes only.
Without bubblewrap we fall back to `unshare` (no network, own pid namespace, but the host
filesystem is visible and writable wherever the uid may write) or to rlimits alone, and say so
once on stderr.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import resource
import shutil
import subprocess
import sys
import threading

log = logging.getLogger("leakray.sandbox")

BWRAP, UNSHARE, NONE = "bwrap", "unshare", "none"
_detected: dict[str, str] = {}
_warned: set[str] = set()
_lock = threading.Lock()

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def _probe(argv: list[str], preexec=None) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10, preexec_fn=preexec).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def detect(requested: str = "auto", uid_base: int = 200000, quiet: bool = False) -> str:
    """The strongest isolation that works here; warns loudly (once) when it is not bubblewrap,
    unless `quiet` (the caller refuses to run on it and says so itself)."""
    with _lock:
        key = f"{requested}:{uid_base}"
        kind = _detected.get(key)
        if kind is None:
            bwrap = shutil.which("bwrap")
            if requested in ("auto", BWRAP) and bwrap and _probe(
                    bwrap_argv(files={}, work_dir_mb=1, env={}) + drop_prefix(uid_base) + ["/bin/true"]):
                kind = BWRAP
            elif requested in ("auto", BWRAP, UNSHARE) and shutil.which("unshare") and _probe(
                    _unshare_prefix() + ["/bin/true"]):
                kind = UNSHARE
            else:
                kind = NONE
            _detected[key] = kind
        if kind != BWRAP and not quiet:
            what = {UNSHARE: "`unshare -n` + rlimits: no network, but the host filesystem is visible "
                             "and writable wherever the sandbox uid may write",
                    NONE: "rlimits only: NETWORK AND HOST FILESYSTEM ARE REACHABLE"}[kind]
            msg = (f"leakray sandbox: bubblewrap {'not requested' if requested not in ('auto', BWRAP) else 'unavailable'}"
                   f"; falling back to {what}. Install bubblewrap (apt-get install bubblewrap) for real isolation.")
            warn_once(kind, msg)
        return kind


def warn_once(key: str, msg: str) -> None:
    """Loud, once per process: weaker isolation must never go unnoticed."""
    if key in _warned:
        return
    _warned.add(key)
    log.info(msg)  # the banner below is the loud copy; logging's last-resort handler would double it
    print("!" * 78 + "\n" + msg + "\n" + "!" * 78, file=sys.stderr, flush=True)


def uid_can_run(python: str, uid: int) -> bool:
    return _probe([python, "-I", "-c", "pass"], _drop_privileges(uid))


def _unshare_prefix() -> list[str]:
    # as root `unshare` works directly; otherwise a user namespace must own the new ones. The pid
    # namespace keeps the program from signalling us (kill(getppid()), kill(-1)).
    base = ["unshare", "-n", "-p", "-f", "--kill-child"]
    return base if os.geteuid() == 0 else base[:1] + ["-r"] + base[1:]


class UidPool:
    """Hands out an unprivileged uid per concurrent run (only when we are root).

    A lock file per uid keeps two processes on one host (several Ray actors) from sharing one,
    which would make them share one process limit."""

    def __init__(self, base: int, size: int = 4096):
        self.base, self.size = base, size
        self.dir = "/tmp/leakray-uids"
        os.makedirs(self.dir, exist_ok=True)

    def acquire(self) -> tuple[int, int]:
        for _ in range(1000):
            uid = self.base + random.randrange(self.size)
            fd = os.open(f"{self.dir}/{uid}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid, fd
            except OSError:
                os.close(fd)
        raise RuntimeError("no free sandbox uid")

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)  # closing drops the flock


def drop_prefix(uid: int | None, max_procs: int | None = None) -> list[str]:
    """Inside bwrap, before the program starts. As root: become `uid` with no capabilities.
    Otherwise: set the process limit only now, inside the new user namespace, where the kernel
    counts this sandbox's processes alone (set outside, it would count all of ours)."""
    if os.geteuid() != 0:
        return ["prlimit", f"--nproc={max_procs}", "--"] if max_procs and shutil.which("prlimit") else []
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]


def _drop_privileges(uid: int):
    def pre():
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return pre


def preexec(*, uid: int | None, memory_mb: int, cpu_s: float, max_procs: int, max_file_bytes: int,
            drop: bool = True):
    """What the child does between fork and exec: own session, limits, then (unless bwrap will do
    it inside, `drop=False`) drop root."""
    def fn():
        os.setsid()
        cpu = int(cpu_s) + 1
        limits = [
            (resource.RLIMIT_AS, memory_mb << 20),
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # soft: SIGXCPU; hard: SIGKILL
            (resource.RLIMIT_FSIZE, max_file_bytes),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NOFILE, 256),
        ]
        if uid is not None:  # for root this is the only way the limit is enforced at all
            limits.append((resource.RLIMIT_NPROC, max_procs))
        for what, value in limits:
            resource.setrlimit(what, value if isinstance(value, tuple) else (value, value))
        if uid is not None and drop:
            _drop_privileges(uid)()
    return fn


def bwrap_argv(*, files: dict[str, int], work_dir_mb: int, env: dict[str, str], ro_binds=()) -> list[str]:
    """bubblewrap arguments; `files` maps names in the private /tmp to fds bwrap copies them from,
    `ro_binds` is [(source, destination)]."""
    # As root bwrap is privileged: no user namespace (a uid mapped to root escapes RLIMIT_NPROC), and
    # `drop_prefix` switches to the run's own uid inside. Otherwise a user namespace is required.
    unshare = (["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
               if os.geteuid() == 0 else ["--unshare-all"])
    argv = [shutil.which("bwrap") or "bwrap", *unshare, "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
            "--perms", "0777", "--size", str(work_dir_mb << 20), "--tmpfs", "/tmp"]
    for hidden in HIDDEN:
        if os.path.isdir(hidden) and not os.path.islink(hidden):
            argv += ["--tmpfs", hidden]
    made: set[str] = set()
    for src, dest in ro_binds:  # after the tmpfs masks, so a jar from ~/.m2 is still visible
        parts = dest.strip("/").split("/")[:-1]
        for k in range(2, len(parts) + 1):  # parents bwrap would otherwise make 0700, closed to the uid
            parent = "/" + "/".join(parts[:k])
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
        argv += ["--ro-bind", src, dest]
    for name, fd in files.items():
        # a name with a directory (the warm javac's classes/, .h/): its parents made first, root's,
        # and the file read-only, as the program has no business changing its own classes
        parts = name.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            parent = "/tmp/" + "/".join(parts[:k])
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
        argv += ["--perms", "0444" if parts else "0666", "--file", str(fd), f"/tmp/{name}"]
    argv += ["--chdir", "/tmp", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


HIDDEN = ("/root", "/home", "/run", "/var/run", "/var/tmp", "/dev/shm", "/mnt", "/media")
# Masked inside the sandbox: the hidden directories and the private /tmp. An interpreter
# installed under one of them (a venv in a checkout under /tmp, pyenv under /root) is bound back.
MASKED = HIDDEN + ("/tmp",)


def exposed_paths(executables: list[str], dirs: list[str] = ()) -> list[tuple[str, str]]:
    """Install prefixes of `executables`, and `dirs`, that lie under a masked directory, to bind
    back read-only (the harness files live in this package, wherever it is installed)."""
    out: list[tuple[str, str]] = []
    candidates = [p for exe in executables for p in (os.path.dirname(os.path.dirname(os.path.abspath(exe))),
                                                      os.path.dirname(os.path.dirname(os.path.realpath(exe))))]
    candidates += [os.path.realpath(d) for d in dirs]
    for path in candidates:
        if any(path == h or path.startswith(h + "/") for h in MASKED) and (path, path) not in out:
            out.append((path, path))
    return out


def sandbox_env(home: str = "/tmp") -> dict[str, str]:
    """The whole environment a program sees: nothing from the host."""
    return {
        "PATH": SANDBOX_PATH, "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0",
        # one thread per BLAS/OpenMP pool: keeps numpy under the process and address-space limits
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "MPLBACKEND": "Agg",
    }
