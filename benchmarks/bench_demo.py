"""Wall time of `leakray demo` end to end, per stage, on this machine.

Runs the demo twice into a fresh runs directory with a fresh model cache: the first run
pretrains the base model, the second (a new run directory, forced by a different
detector seed list) must reuse the cached base model. Prints both runs' stage timings
side by side and the ratio of their totals.

    python benchmarks/bench_demo.py [--quick] [--keep DIR] [--set key=value ...]
    python benchmarks/bench_demo.py --fresh [--keep DIR]

``--fresh`` measures what a new user waits for: a fresh clone of this repository's HEAD, a new
HOME and model cache, then the README's command (`bash scripts/demo.sh`, install included),
timed as a whole; then the stage timings from its report, each with how busy the machine's CPUs
were during it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_demo(out: Path, cache: Path, extra: list[str]) -> tuple[dict, float]:
    env = dict(os.environ, LEAKRAY_CACHE=str(cache), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "leakray.cli", "demo", "--output", str(out), *extra], env=env,
                   check=True)
    wall = time.perf_counter() - t0
    newest = max(out.glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(newest.read_text()), wall


def fresh(root: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    clone, home = root / "clone", root / "home"
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "LEAKRAY", "PYTHONPATH"))}
    env.update(HOME=str(home), LEAKRAY_CACHE=str(home / ".cache" / "leakray"),
               PATH=":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p))
    t0 = time.perf_counter()
    subprocess.run(["bash", "scripts/demo.sh"], cwd=clone, env=env, check=True)
    wall = time.perf_counter() - t0
    (report,) = (clone / "runs").glob("*/report.json")
    r = json.loads(report.read_text())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
    print(f"\nfresh clone {clone} (HEAD {head.stdout.strip()}): `bash scripts/demo.sh` took {wall:.0f} s")
    # machine busy: the share of the machine's CPU time busy during the stage (near 100%: CPU-bound,
    # so no reordering of stages would shorten the run; only less work would)
    for stage, seconds in r["timings_s"].items():
        busy = (r.get("stages") or {}).get(stage, {}).get("machine_busy")
        print(f"  {stage:<24}{seconds or 0:>8.1f} s" + (f"   machine busy {busy:.0%}" if busy is not None else ""))
    for name in ("cgmia", "advprompt", "ref_loss", "gt_match"):
        d = r["detectors"].get(name) or {}
        print(f"  {name:<16} AUC {d.get('auc')} {d.get('auc_ci')}")
    env = r.get("environment") or {}  # the table repeats only on the same kind of CPU
    print(f"  host: {env.get('cpu')}, torch CPU kernels {env.get('torch_cpu_capability')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fresh", action="store_true", help="fresh clone, new HOME and cache, the README's command")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", help="directory for runs and cache (default: a temporary one)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="leakray-bench-"))
    if args.fresh:
        return fresh(root)
    extra = (["--quick"] if args.quick else []) + [x for o in args.overrides for x in ("--set", o)]
    first, wall1 = run_demo(root / "runs", root / "cache", extra)
    second, wall2 = run_demo(root / "runs", root / "cache", extra + ["--set", "detect.seeds=[0,1,2,3,4,5]"])
    t1, t2 = first["timings_s"], second["timings_s"]
    print(f"\n{'stage':<24}{'first run (s)':>16}{'cached base (s)':>18}")
    for stage in t1:
        print(f"{stage:<24}{t1.get(stage) or 0:>16.1f}{t2.get(stage) or 0:>18.1f}")
    print(f"{'wall (process)':<24}{wall1:>16.1f}{wall2:>18.1f}")
    print(f"second/first wall ratio: {wall2 / wall1:.2f}  (base model cached: {second['models']['base']['cached']})")
    for name in ("cgmia", "detectleak"):
        print(name, json.dumps(first["detectors"][name]))
    leak = first["leak"]["target"]
    print("target members:", json.dumps(leak["members"]))
    print("target non-members:", json.dumps(leak["non_members"]))
    print("graded:", leak.get("graded"))


if __name__ == "__main__":
    main()
