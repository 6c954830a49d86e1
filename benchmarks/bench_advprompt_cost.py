"""What AdvPrompt-MIA costs: `leakray demo` with and without it, side by side, one process each.

Both runs share one model cache (the base model is pretrained at most once, before either
is timed when it is missing), so the difference is the perturbation stage, the variant
sampling (up to 12 greedy completions per prompt), the extra embedding and the detector.
Prints per-stage wall time for both runs and the ratio of their totals.

    python benchmarks/bench_advprompt_cost.py [--quick] [--keep DIR] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_demo import run_demo  # noqa: E402

from leakray.runs import cache_root  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", help="directory for the runs (default: a temporary one)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="leakray-advcost-"))
    extra = (["--quick"] if args.quick else []) + [x for o in args.overrides for x in ("--set", o)]
    off, wall_off = run_demo(root / "without", cache_root(), extra + ["--set", "columns.advprompt=false"])
    on, wall_on = run_demo(root / "with", cache_root(), extra + ["--set", "columns.advprompt=true"])
    t_off, t_on = off["timings_s"], on["timings_s"]
    print(f"\n{'stage':<24}{'without (s)':>14}{'with advprompt (s)':>20}")
    for stage in dict.fromkeys([*t_on, *t_off]):
        print(f"{stage:<24}{t_off.get(stage) or 0:>14.1f}{t_on.get(stage) or 0:>20.1f}")
    print(f"{'wall (process)':<24}{wall_off:>14.1f}{wall_on:>20.1f}")
    print(f"with/without wall ratio: {wall_on / wall_off:.2f}  "
          f"(base model cached: {off['models']['base']['cached']} / {on['models']['base']['cached']})")
    adv = on["detectors"].get("advprompt") or on.get("skipped", {}).get("advprompt")
    print("advprompt:", json.dumps(adv))
    print("advprompt present without:", "advprompt" in off["detectors"])


if __name__ == "__main__":
    main()
