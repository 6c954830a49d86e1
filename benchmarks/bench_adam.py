"""The detectors' optimiser: torch.optim.Adam(fused=True) against leakray's FusedAdam (the same
`torch._fused_adam_` kernel and state, without torch.optim's Optimizer), side by side in one run.

    python benchmarks/bench_adam.py [--repeat 3] [--steps 525]

1. A fresh process's first optimiser (construct, one step): torch's Optimizer imports
   torch._dynamo and sympy at its first use; every process that fits a detector and loads no
   transformers model (a detect stage's Ray workers and its driver) pays it once. CPU seconds
   of the child, each arm `--repeat` times, alternating.
2. One AdvPrompt-MIA fit's steps (its MLP, 27-512-512-512-2 with dropout, batches of 4, 525
   steps: 82 rows x 25 epochs), CPU seconds of this process on one thread, alternating; and
   whether the two arms' weights are equal to the bit.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIRST_USE = """
import time, torch
t0 = time.process_time()
net = torch.nn.Linear(27, 2)
if {ours}:
    from leakray.models.kernels import FusedAdam
    opt = FusedAdam(net.parameters(), lr=1e-3)
else:
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
torch.nn.functional.cross_entropy(net(torch.randn(4, 27)), torch.zeros(4, dtype=torch.long)).backward()
opt.step(); opt.zero_grad()
print(time.process_time() - t0)
"""


def first_use(ours: bool) -> float:
    out = subprocess.run([sys.executable, "-c", FIRST_USE.format(ours=ours)], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent)
    return float(out.stdout.split()[-1])


def fit_steps(ours: bool, steps: int):
    import torch

    from leakray.models.kernels import FusedAdam

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(27, 512), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                              torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                              torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                              torch.nn.Linear(512, 2))
    opt = FusedAdam(net.parameters(), lr=1e-3) if ours else torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(82, 27, generator=gen), torch.randint(0, 2, (82,), generator=gen)
    torch.manual_seed(2)
    t0 = time.process_time()
    for s in range(steps):
        idx = torch.randint(0, 82, (4,), generator=gen)
        loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.process_time() - t0, [p.detach().clone() for p in net.parameters()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=525)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    firsts = {"torch.optim.Adam": [], "FusedAdam": []}
    for _ in range(args.repeat):
        firsts["torch.optim.Adam"].append(first_use(False))
        firsts["FusedAdam"].append(first_use(True))
    print("first use in a fresh process (construct + one step), CPU s, median of", args.repeat)
    for k, v in firsts.items():
        print(f"  {k:<18}{statistics.median(v):8.3f}   ({', '.join(f'{x:.3f}' for x in v)})")
    print(f"  saved per process: {statistics.median(firsts['torch.optim.Adam']) - statistics.median(firsts['FusedAdam']):.2f} CPU s")
    fit_steps(True, 50), fit_steps(False, 50)  # warm both paths
    times = {"torch.optim.Adam": [], "FusedAdam": []}
    weights = {}
    for _ in range(args.repeat):
        for name, ours in (("torch.optim.Adam", False), ("FusedAdam", True)):
            t, w = fit_steps(ours, args.steps)
            times[name].append(t)
            weights[name] = w
    print(f"one AdvPrompt-MIA fit's {args.steps} steps (batch 4), CPU s on one thread, median of {args.repeat}")
    for k, v in times.items():
        print(f"  {k:<18}{statistics.median(v):8.3f}   ({', '.join(f'{x:.3f}' for x in v)})")
    ratio = statistics.median(times["FusedAdam"]) / statistics.median(times["torch.optim.Adam"])
    same = all(torch.equal(a, b) for a, b in zip(weights["FusedAdam"], weights["torch.optim.Adam"]))
    print(f"  ratio FusedAdam / torch: {ratio:.3f}; weights equal to the bit: {same}")


if __name__ == "__main__":
    main()
