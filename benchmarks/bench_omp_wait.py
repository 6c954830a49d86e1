"""OpenMP's wait policy when processes share the CPUs: libgomp's default (a waiting thread spins,
GOMP_SPINCOUNT=300000), a short spin (GOMP_SPINCOUNT=1000) and OMP_WAIT_POLICY=PASSIVE (it
sleeps at once), which `import leakray` sets (leakray/__init__.py).

    python benchmarks/bench_omp_wait.py [--procs 2] [--steps 10000] [--arms default,spin1000,passive]

Each arm runs the same torch loop (small matrix products, as a tiny model's or a detector's fit
makes: many short parallel regions) in fresh processes, with torch's default thread count (one
per core): one process alone, then ``--procs`` processes at once (more threads than cores, as a
driver fitting beside Ray's workers is). Printed per arm: wall time and the CPU seconds of each
process, and each arm's ratio to passive, side by side in one run. Alone, spinning is faster
(a woken thread is late to each short parallel region); shared, the default can take tens of
times the CPU, as each process's spinning threads hold the cores the other's threads wait for.
The demo's detect stage with and without the setting is in docs/MEASUREMENTS.md (its command
there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LOOP = """
import json, os, sys, time
import torch
torch.manual_seed(0)
x, w = torch.randn(64, 256), torch.randn(256, 256)
t0, c0 = time.perf_counter(), time.process_time()
for _ in range({steps}):
    y = torch.tanh(x @ w)
print(json.dumps({{"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "threads": torch.get_num_threads(), "policy": os.environ.get("OMP_WAIT_POLICY")}}))
"""


ARMS = {"default": {}, "spin1000": {"GOMP_SPINCOUNT": "1000"}, "spin100": {"GOMP_SPINCOUNT": "100"},
        "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}


def run_arm(setting: dict, procs: int, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update(setting)
    children = [subprocess.Popen([sys.executable, "-c", LOOP.format(steps=steps)], env=env, stdout=subprocess.PIPE,
                                 text=True) for _ in range(procs)]
    outs = [json.loads(c.communicate()[0]) for c in children]
    # the loops' own time (each process's start-up and torch import left out), the slowest one's wall
    return {"wall": max(o["wall"] for o in outs), "cpu": sum(o["cpu"] for o in outs), "threads": outs[0]["threads"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=2, help="processes at once in the shared arms")
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--arms", default="default,spin1000,passive", help=f"of {list(ARMS)}")
    args = ap.parse_args()
    arms = args.arms.split(",")
    print(f"{os.cpu_count()} CPUs; torch's default threads per process; {args.steps} steps per process")
    print(f"{'arm':<28}{'wall s':>9}{'CPU s':>9}")
    for procs in (1, args.procs):
        got = {}
        for arm in arms:
            r = got[arm] = run_arm(ARMS[arm], procs, args.steps)
            print(f"{f'{procs} at once, {arm}':<28}{r['wall']:>9.2f}{r['cpu']:>9.2f}   ({r['threads']} threads each)",
                  flush=True)
        for arm in (a for a in arms if a != "passive" and "passive" in got):
            d, p = got[arm], got["passive"]
            print(f"{f'{procs} at once: {arm}/passive':<28}{d['wall'] / p['wall']:>8.2f}x{d['cpu'] / p['cpu']:>8.2f}x")


if __name__ == "__main__":
    main()
