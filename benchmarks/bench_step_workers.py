"""The sampler on Ray's reused task workers against an actor pool per collection, side by side:
`leakray demo` (or `--quick`) run with `ray.reuse_workers=false` and `=true`, the arms
alternating, each with a new output directory and a new model cache (the base is copied from the
package, the proofs are made in every arm), then each stage's wall and busy CPU seconds (the
machine's, from each stage's marker) per arm and their ratio.

    python benchmarks/bench_step_workers.py [--rounds 1] [--quick] [--keep DIR] [--set key=value ...]

The detector tables of the two arms are compared as well: where a step runs must not change
what it computes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_demo import run_demo  # noqa: E402

ARMS = {"actors": "false", "reused": "true"}


def stage_use(report: dict) -> dict[str, tuple[float, float]]:
    """{stage: (wall s, the machine's busy CPU s)} from a report's stages: each carries the share of
    the machine's CPU time busy over it (`runs.machine_use`)."""
    out = {}
    for name, st in (report.get("stages") or {}).items():
        wall = float(st.get("seconds") or 0.0)
        busy = st.get("machine_busy")
        out[name] = (wall, wall * busy * (os.cpu_count() or 1) if busy is not None else float("nan"))
    return out


def table(report: dict) -> str:
    """The detectors' numbers, not their costs."""
    return json.dumps({n: {k: v for k, v in m.items() if k != "cost"} for n, m in report["detectors"].items()},
                      sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", default=None, help="keep the runs under this directory")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-step-workers-"))
    runs: dict[str, list[tuple[dict, float]]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm, value in ARMS.items():
            extra = ["--quick"] if args.quick else []
            for s in [*args.sets, f"ray.reuse_workers={value}"]:
                extra += ["--set", s]
            where = root / f"round{r}-{arm}"
            print(f"round {r + 1}: {arm} (ray.reuse_workers={value})", flush=True)
            runs[arm].append(run_demo(where / "runs", where / "cache", extra))

    print(f"\nper stage, mean over {args.rounds} round(s): wall s / machine busy CPU s")
    use = {arm: [stage_use(rep) for rep, _ in got] for arm, got in runs.items()}
    stages = sorted({s for got in use.values() for u in got for s in u})
    print(f"  {'stage':<18}{'actors':>18}{'reused':>18}{'wall ratio':>12}{'CPU ratio':>11}")
    for stage in stages:
        mean = {arm: [sum(u.get(stage, (0, 0))[i] for u in got) / len(got) for i in (0, 1)] for arm, got in use.items()}
        a, b = mean["actors"], mean["reused"]
        ratio = lambda x, y: f"{y / x:.2f}x" if x else "-"  # noqa: E731
        print(f"  {stage:<18}{a[0]:>8.1f} / {a[1]:>6.1f}{b[0]:>9.1f} / {b[1]:>6.1f}{ratio(a[0], b[0]):>12}"
              f"{ratio(a[1], b[1]):>11}")
    walls = {arm: sum(w for _, w in got) / len(got) for arm, got in runs.items()}
    print(f"  {'whole command':<18}{walls['actors']:>8.1f} s{'':>8}{walls['reused']:>9.1f} s{'':>8}"
          f"{walls['reused'] / walls['actors']:>11.2f}x")
    same = all(table(a) == table(b) for (a, _), (b, _) in zip(runs["actors"], runs["reused"]))
    print(f"detector tables equal in every round: {same}")
    print(f"runs kept under {root}" if args.keep else "")


if __name__ == "__main__":
    main()
