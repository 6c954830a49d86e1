"""Peak growth of this process's resident memory while a block runs, sampled by a thread.

A detector's memory cost used to be tracemalloc's peak of Python allocations. tracemalloc hooks
every allocation: on the demo's collections it made the detectors' fits 2.1x as costly in CPU
(172 -> 359 s over every detector and seed, one process, `benchmarks/bench_detect.py --memory`),
and it does not see torch's tensors, where the learned detectors keep most of their memory. The
resident set sees everything the process holds (numpy, torch, native libraries); reading it
costs microseconds, so a thread reads it every ``interval`` seconds, and once more at the end.

What it measures: the largest resident set seen minus the one at the start. It can miss a peak
shorter than the interval, and it counts what other threads of the process allocate meanwhile:
the detect stage runs one detector per Ray worker process, but the groups it runs from the
driver share the driver's process (each in a thread: the Tune search, and CGMIA's fits, which on
CPUs train in that thread). Where the resident set cannot be read (no ``/proc``), it is None.
"""

from __future__ import annotations

import os
import threading

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident set now (Linux: /proc/self/statm), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class RssPeak:
    """``with RssPeak() as peak: ...`` then ``peak.mb``: the resident set's largest growth in MiB."""

    def __init__(self, interval: float = 0.01):
        self.interval = float(interval)
        self.mb: float | None = None
        self._base: int | None = None
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        now = resident_bytes()
        if now is not None and now > self._peak:
            self._peak = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "RssPeak":
        self._base = resident_bytes()
        if self._base is not None:
            self._peak = self._base
            self._thread = threading.Thread(target=self._run, name="rss-peak", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._sample()  # the block's last state, between two samples
        self._stop.set()
        self._thread.join()
        self.mb = (self._peak - self._base) / 2**20
