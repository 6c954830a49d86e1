"""Host side of the warm workers (zygote_py.py): one long-lived bubblewrap sandbox per concurrent
slot, each with its own unprivileged uid, talking length-prefixed JSON over its stdin/stdout."""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

from leakray.sandbox import isolation as iso

ZYGOTE_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote_py.py")


class Zygote:
    def __init__(self, python: str, uid: int, uid_lock: int, work_dir_mb: int, exposed):
        self.uid, self._uid_lock = uid, uid_lock
        argv = iso.bwrap_argv(files={}, work_dir_mb=work_dir_mb, env=iso.sandbox_env(), ro_binds=exposed)
        self.proc = subprocess.Popen(argv + [python, "-I", ZYGOTE_PY], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)

    def call(self, request: dict, timeout: float, token: str = "") -> dict | None:
        """The zygote's answer, or None if it is gone or silent past `timeout` (then it is closed).
        The token goes in a frame of its own, after the request (see zygote_py)."""
        try:
            for frame in (request, {"token": token}):
                data = json.dumps(frame).encode()
                self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
            out = self.proc.stdout
            if not select.select([out], [], [], timeout)[0]:
                raise TimeoutError
            head = out.read(4)
            if len(head) < 4:
                raise EOFError
            return json.loads(out.read(struct.unpack(">I", head)[0]))
        except (OSError, ValueError, EOFError, TimeoutError):
            self.close()
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        stop(self.proc)
        if self._uid_lock is not None:
            iso.UidPool.release(self._uid_lock)
            self._uid_lock = None


def stop(proc: subprocess.Popen | None) -> None:
    """Kill a warm worker's sandbox (its bubblewrap's process group), reap it, close its pipes."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:
            pass


class ZygotePool:
    """Idle zygotes; a run borrows one, so concurrency is bounded by the callers' threads.

    Zygotes are started from one thread of the pool's own that lives as long as the pool, never
    from the borrowing thread: bwrap's `--die-with-parent` is the kernel's parent-death signal,
    which fires when the *thread* that started the process ends, not the process. Started from
    `run_many`'s short-lived worker threads, every zygote was killed as its batch's thread pool
    shut down, and a stage calling `run_many` once per batch paid a zygote start (an interpreter
    importing pytest and numpy) and a cold run per worker thread per batch: 84 zygotes for 21
    batches of the perturb stage's proofs, 61 busy CPU s instead of 37
    (`benchmarks/bench_sandbox.py --batches --workers 4`)."""

    def __init__(self, make):
        self._make, self._idle, self._lock = make, [], threading.Lock()
        self._starter: ThreadPoolExecutor | None = None

    def borrow(self) -> Zygote:
        with self._lock:
            while self._idle:
                z = self._idle.pop()
                if z.alive():
                    return z
                z.close()
            if self._starter is None:
                self._starter = ThreadPoolExecutor(1, thread_name_prefix="leakray-zygotes")
            starter = self._starter
        return starter.submit(self._make).result()

    def give_back(self, z: Zygote) -> None:
        if z.alive():
            with self._lock:
                self._idle.append(z)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            starter, self._starter = self._starter, None
        for z in idle:
            z.close()
        if starter is not None:  # its thread ends: a zygote still borrowed dies with it
            starter.shutdown(wait=False)
