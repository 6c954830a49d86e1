"""Peak growth of this process's resident memory while a block runs.

A detector's memory cost used to be tracemalloc's peak of Python allocations. tracemalloc hooks
every allocation: on the demo's collections it made the detectors' fits 2.1x as costly in CPU
(172 -> 359 s over every detector and seed, one process, `benchmarks/bench_detect.py --memory`),
and it does not see torch's tensors, where the learned detectors keep most of their memory. The
resident set sees everything the process holds (numpy, torch, native libraries).

How the peak is read, two ways:

- **The kernel's high-water mark** (Linux): writing 5 to /proc/self/clear_refs resets the
  process's peak resident set to its current one, and /proc/self/status's VmHWM is then the
  largest resident set since. Exact: no peak is missed, however short. On the demo's collections
  the same work (CGMIA's five seeds, after a warm-up run) peaked 326 MB above its start by the
  mark and 147 MB by a 100 Hz sampler (`benchmarks/bench_detect.py RUN_DIR --rss`). Used when
  the block is the only one measured in the process at its start: the detect stage runs one
  detector at a time per Ray worker process, so every detector there is measured so.
- **A sampling thread** otherwise: it reads the resident set every ``interval`` seconds and once
  more at the end, and can miss a peak shorter than the interval. The groups the detect stage
  runs from its driver share the driver's process, each in a thread (the Tune search, and
  CGMIA's fits, which on CPUs train in that thread): a block that starts while another is
  measured must not reset the other's mark, so it samples. (The thread costs little: about 1%
  of a detector's CPU at 100 Hz, the same script.)

Either way it counts what other threads of the process allocate meanwhile. Where the resident
set cannot be read (no ``/proc``), the result is None.
"""

from __future__ import annotations

import os
import threading

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LOCK = threading.Lock()
_ACTIVE = 0  # blocks being measured in this process now
USE_MARK = True  # the high-water mark where it can be used (benchmarks/bench_detect.py --rss turns it off)


def resident_bytes() -> int | None:
    """This process's resident set now (Linux: /proc/self/statm), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def high_water_bytes() -> int | None:
    """The process's peak resident set since it started or its mark was last reset (VmHWM)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_high_water() -> bool:
    """Set the peak resident set to the current one; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return high_water_bytes() is not None
    except OSError:
        return False


class RssPeak:
    """``with RssPeak() as peak: ...`` then ``peak.mb``: the resident set's largest growth in MiB,
    and ``peak.how``: "high-water mark" or "sampled" (see the module's docstring)."""

    def __init__(self, interval: float = 0.01, use_mark: bool | None = None):
        self.interval = float(interval)
        self.use_mark = USE_MARK if use_mark is None else use_mark
        self.mb: float | None = None
        self.how: str | None = None
        self._base: int | None = None
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._entered = False

    def _sample(self) -> None:
        now = resident_bytes()
        if now is not None and now > self._peak:
            self._peak = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "RssPeak":
        global _ACTIVE
        self._base = resident_bytes()
        if self._base is None:
            return self
        self._peak = self._base
        with _LOCK:
            alone = _ACTIVE == 0
            _ACTIVE += 1
            self._entered = True
            if alone and self.use_mark and reset_high_water():
                self.how = "high-water mark"
                return self
        self.how = "sampled"
        self._thread = threading.Thread(target=self._run, name="rss-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        if self._base is None:
            return
        self._sample()  # the block's last state (between two samples, or beside the mark)
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        elif self.how == "high-water mark":
            mark = high_water_bytes()
            if mark is not None:
                self._peak = max(self._peak, mark)
        if self._entered:
            with _LOCK:
                _ACTIVE -= 1
            self._entered = False
        self.mb = (self._peak - self._base) / 2**20
