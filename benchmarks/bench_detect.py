"""The detect stage's work, detector by detector, before and after its speed-ups, in one process.

    python benchmarks/bench_detect.py RUN_DIR [--seeds 5] [--only cgmia,advprompt,...]

RUN_DIR is a demo run (``runs/humaneval-<hash>``: its collect_shadow and collect_target
collections). Every detector's fit + threshold + target scoring for all seeds (what the stage
runs per detector) is timed in CPU seconds of this process, torch on one thread (a Ray worker's
setting), so a busy machine does not distort it:

- each learned detector with torch's for-loop Adam (before) and the fused kernel (after:
  ``leakray.models.kernels.adam``), and their ratio;
- cgmia + cgmia_ensemble fitted one after the other, each its own fits (before: 5 + 15 CGMIA
  seeds at 3 members), against one group fit where the ensemble reuses CGMIA's fits (after: 7).

The stage's wall time on the demo (Ray tasks, Ray Train and Tune side by side) is in the
demo's marker; this script shows where the core-seconds went.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--only", default="advprompt,cgmia,cnn,lstm,transformer,leakray_combined,text_combined,gotcha")
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import torch

    import leakray.detect.advprompt
    import leakray.detect.cgmia
    import leakray.detect.sequence
    from leakray.detect import registry
    from leakray.detect.base import FitContext
    from leakray.protocols.detectors import fit_and_score

    torch.set_num_threads(1)
    shadow = pq.read_table(args.run_dir / "collect_shadow" / "collection.parquet")
    target = pq.read_table(args.run_dir / "collect_target" / "collection.parquet")
    seeds = list(range(args.seeds))
    ctx = FitContext()
    boot = {"n_bootstrap": 0, "bootstrap_seed": 0}
    users = (leakray.detect.advprompt, leakray.detect.cgmia, leakray.detect.sequence)  # who trains with adam
    fused = leakray.detect.cgmia.adam

    def use(adam) -> None:
        for module in users:
            module.adam = adam

    def loop_adam(params, **kw):  # the for-loop implementation: torch's CPU default
        return torch.optim.Adam(params, **kw)

    def run(members: list[str]) -> float:
        return cpu(lambda: fit_and_score((members, seeds), shadow, target, {}, ctx, False, boot))[1]

    print(f"{shadow.num_rows} shadow rows, {target.num_rows} target rows, seeds {seeds}; CPU seconds, one thread")
    print(f"{'detector':<22}{'for-loop Adam':>15}{'fused Adam':>12}{'ratio':>8}")
    total = [0.0, 0.0]
    for name in args.only.split(","):
        registry.detector_class(name)
        use(loop_adam)
        before = run([name])
        use(fused)
        after = run([name])
        total[0] += before
        total[1] += after
        print(f"{name:<22}{before:>15.1f}{after:>12.1f}{after / before:>8.2f}")
    print(f"{'total':<22}{total[0]:>15.1f}{total[1]:>12.1f}{total[1] / total[0]:>8.2f}")

    apart = run(["cgmia"]) + run(["cgmia_ensemble"])
    together = run(["cgmia", "cgmia_ensemble"])
    print(f"\ncgmia + cgmia_ensemble (fused Adam): apart {apart:.1f} s, one group {together:.1f} s, "
          f"ratio {together / apart:.2f}")


if __name__ == "__main__":
    main()
