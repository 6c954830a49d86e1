"""Wall time of a dose-sweep on this machine, per dose and stage, and its detectability curve.

    python benchmarks/bench_dose_sweep.py --output /tmp/dose --set leak.steps=100 --set sample.k=2

Runs `leakray simulate --set leak.mode=dose-sweep` (doses 1, 4, 16 unless --set leak.doses=...)
and prints the seconds each stage took at each dose (from the stage markers), the total, and
the curve (dose -> AUC per detector) from the sweep's detectability.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    sets = [x for o in ["leak.mode=dose-sweep", *args.overrides] for x in ("--set", o)]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "leakray.cli", "simulate", *sets, "--output", args.output],
                          capture_output=True, text=True)
    total = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    (sweep,) = Path(args.output).glob("dose-sweep-*")
    curve = json.loads((sweep / "detectability.json").read_text())
    stages = {}
    for dose, run in curve["runs"].items():
        stages[dose] = {p.parent.name: json.loads(p.read_text())["seconds"] for p in Path(run).glob("*/_DONE.json")}
    out = {"total_seconds": round(total, 1), "overrides": args.overrides, "stage_seconds": stages,
           "auc": {n: m["auc"] for n, m in curve["detectors"].items()}, "doses": curve["doses"],
           "detected_at": {n: m["smallest_dose_detected"] for n, m in curve["detectors"].items()},
           "member_token_share": curve["member_token_share"]}
    (Path(args.output) / "bench_dose_sweep.json").write_text(json.dumps(out, indent=2))
    print(f"dose-sweep {curve['doses']}: {total / 60:.1f} min in all ({args.overrides})")
    for dose, st in stages.items():
        print(f"  dose {dose}: " + ", ".join(f"{k} {v:.0f}s" for k, v in sorted(st.items(), key=lambda kv: -kv[1])))
    print((sweep / "detectability.md").read_text())


if __name__ == "__main__":
    main()
