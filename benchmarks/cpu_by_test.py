"""Where the test suite's CPU goes, by test: a pytest plugin that reads the machine's busy CPU
seconds (/proc/stat) before and after each test's setup, call and teardown, so the CPU of
everything a test starts (Ray workers, sandboxes, compilers, drivers) is charged to it.

    python -m pytest -p benchmarks.cpu_by_test -p no:xdist -q [tests...]

Run it serially (`-p no:xdist`) on a quiet machine: with two tests at once, or other users,
the machine's CPU cannot be told apart. A session fixture's cost lands on the first test that
asks for it, and what a test leaves running (a Ray cluster kept for the session) on the tests
after it. Prints the top tests, the modules' totals and the sum at the end; writes every row
to $LEAKRAY_CPU_BY_TEST (a JSON file) when that is set.
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

from benchmarks.cpu_by_process import machine_busy_idle

_rows: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"busy_s": 0.0, "wall_s": 0.0})


def _busy() -> float:
    return machine_busy_idle()[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    b0, t0 = _busy(), time.perf_counter()
    yield
    row = _rows[item.nodeid]
    row["busy_s"] += _busy() - b0
    row["wall_s"] += time.perf_counter() - t0


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    w = terminalreporter
    total = sum(r["busy_s"] for r in _rows.values())
    wall = sum(r["wall_s"] for r in _rows.values())
    w.section(f"machine busy CPU by test: {total:.0f} CPU s over {wall:.0f} s of tests")
    for nodeid, r in sorted(_rows.items(), key=lambda kv: -kv[1]["busy_s"])[:40]:
        w.write_line(f"{r['busy_s']:8.1f} {r['wall_s']:8.1f}  {nodeid}")
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for nodeid, r in _rows.items():
        m = modules[nodeid.split("::", 1)[0]]
        m[0] += r["busy_s"]
        m[1] += r["wall_s"]
        m[2] += 1
    w.write_line("   CPU s   wall s  tests  module")
    for name, (busy, wall_s, n) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        w.write_line(f"{busy:8.1f} {wall_s:8.1f} {n:6d}  {name}")
    if os.environ.get("LEAKRAY_CPU_BY_TEST"):
        with open(os.environ["LEAKRAY_CPU_BY_TEST"], "w") as f:
            json.dump(dict(_rows), f, indent=1)
