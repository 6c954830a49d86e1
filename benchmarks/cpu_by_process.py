"""Where a command's CPU goes, by process: the machine's busy CPU seconds over the command, and
each process's own CPU seconds grouped by its title (Ray names its workers `ray::<Task or
Actor>`, so a collection's sampler actors, the sandbox pool and the detectors' tasks each get a
line).

    python benchmarks/cpu_by_process.py [--top 30] -- COMMAND...

e.g. the tests on the real Ray head, alone:

    python benchmarks/cpu_by_process.py -- python -m pytest -q -p no:xdist \\
        tests/test_e2e.py tests/test_faults.py tests/test_audit_e2e.py

Every process's utime + stime is read from /proc twice a second; a process that lives less than
half a second between two reads, or whose last half second falls after the last read, is
undercounted, so the per-title sum is a little under the machine's busy total (which comes
from /proc/stat and counts everything, other users included: run it on a quiet machine).
A worker that Ray retitles after it started (ray::IDLE, then its task) keeps its last title.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
KNOWN = ("pytest", "raylet", "gcs_server", "dashboard", "runtime_env", "log_monitor", "monitor.py", "bwrap",
         "javac", "java ", "default_worker", "jobs/")


def machine_busy_idle() -> tuple[float, float]:
    """(busy, idle) CPU seconds since boot, all CPUs (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / HZ, (idle + iowait) / HZ


def title(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    if not cmd:
        return None
    if cmd.startswith("ray::"):
        return cmd.split()[0]
    m = re.search(r"leakray(?:\.cli)? (\w+)", cmd)
    if m:
        return "leakray " + m.group(1)
    for key in KNOWN:
        if key in cmd:
            return key.strip()
    words = cmd.split()
    return words[0].rsplit("/", 1)[-1][:30] + (" " + words[1][:40] if len(words) > 1 else "")


def snapshot(seen: dict) -> None:
    """Each live process's CPU seconds so far, keyed by (pid, start time) so a reused pid is another process."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        key, cpu = (int(pid), rest[19]), (int(rest[11]) + int(rest[12])) / HZ
        name = title(pid)
        old = seen.get(key)
        if old and (name is None or name == "ray::IDLE"):
            name = old[0]  # keep the task a worker ran rather than its idle title
        seen[key] = (name or "?", cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to measure after --")
    seen: dict = {}
    snapshot(seen)
    before = {k: cpu for k, (_, cpu) in seen.items()}
    busy0, idle0 = machine_busy_idle()
    t0 = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        snapshot(seen)
        time.sleep(0.5)
    snapshot(seen)
    wall = time.monotonic() - t0
    busy1, idle1 = machine_busy_idle()
    by_title, count = collections.Counter(), collections.Counter()
    for key, (name, cpu) in seen.items():
        by_title[name] += cpu - before.get(key, 0.0)
        count[name] += 1
    print(f"\nwall {wall:.0f} s; machine busy CPU {busy1 - busy0:.0f} s, idle {idle1 - idle0:.0f} s; "
          f"per-process sum {sum(by_title.values()):.0f} s", file=sys.stderr)
    print(f"{'CPU s':>8} {'procs':>6}  title", file=sys.stderr)
    for name, cpu in by_title.most_common(args.top):
        if cpu >= 0.5:
            print(f"{cpu:8.1f} {count[name]:6d}  {name}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
