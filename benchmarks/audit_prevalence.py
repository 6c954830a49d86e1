"""Validate the audit's leaked-fraction estimate on planted leaks of known size.

One detector card is built (`leakray card build`), then planted targets are audited from it
at several member fractions and member seeds (`leakray audit --card`); each audit's estimate
and 95% interval is set beside the truth. A second, cheaper check resamples the audited
target with the largest fraction to every fraction many times (members and non-members
drawn from its own collection) and reports the estimator's mean error and the coverage of
its interval.

    python benchmarks/audit_prevalence.py --output /tmp/audit_prev --set sample.k=2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def leakray(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "leakray.cli", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"leakray {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--fractions", default="0,0.1,0.2,0.3,0.5")
    ap.add_argument("--seeds", default="11,21", help="member seeds of the planted targets (fraction 0 runs once)")
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--resample-detectors", default="",
                    help="also resample with these card detectors (weaker ones show the error grow); "
                         "with --only-resample, reuse the audits already in --output")
    ap.add_argument("--only-resample", action="store_true")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    out = Path(args.output)
    runs = out / "runs"
    sets = [x for o in args.overrides for x in ("--set", o)]
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]

    t0 = time.perf_counter()
    if args.only_resample:
        return resample_more(out, fractions, args)
    leakray("card", "build", "--output", str(runs), *sets)
    (card,) = [p / "card" for p in runs.glob("card-*")]
    card_s = time.perf_counter() - t0
    rows = []
    for f in fractions:
        for seed in seeds[:1] if f == 0 else seeds:
            t = time.perf_counter()
            leakray("audit", "--card", str(card), "--output", str(runs), *sets,
                    "--set", f"audit.member_fraction={f}", "--set", f"audit.member_seed={seed}")
            report = newest_report(runs)
            p = report["summary"]["prevalence"]
            rows.append({"fraction": f, "seed": seed, "truth": p["truth"], "estimate": p["estimate"], "ci": p["ci"],
                         "em": p["em"], "classify_and_count": p["classify_and_count"],
                         "covered": p["ci"][0] <= p["truth"] <= p["ci"][1],
                         "error": p["estimate"] - p["truth"], "primary": report["summary"]["primary_detector"],
                         "run": report["_dir"], "seconds": round(time.perf_counter() - t, 1)})
            print(json.dumps(rows[-1]), flush=True)
    resampled = resample_check(Path(max(rows, key=lambda r: r["truth"])["run"]), card, fractions, args.resamples)
    result = {"card_seconds": round(card_s, 1), "audits": rows, "resampled": resampled, "overrides": args.overrides,
              "total_seconds": round(time.perf_counter() - t0, 1)}
    (out / "audit_prevalence.json").write_text(json.dumps(result, indent=2))
    (out / "audit_prevalence.md").write_text(markdown(result))
    print(markdown(result))


def resample_more(out: Path, fractions: list[float], args) -> None:
    result = json.loads((out / "audit_prevalence.json").read_text())
    (card,) = [p / "card" for p in (out / "runs").glob("card-*")]
    run = Path(max(result["audits"], key=lambda r: r["truth"])["run"])
    for name in filter(None, args.resample_detectors.split(",")):
        result["resampled"] += resample_check(run, card, fractions, args.resamples, name)
    (out / "audit_prevalence.json").write_text(json.dumps(result, indent=2))
    (out / "audit_prevalence.md").write_text(markdown(result))
    print(markdown(result))


def newest_report(runs: Path) -> dict:
    run = max(runs.glob("audit-*/report.json"), key=lambda p: p.stat().st_mtime)
    return {**json.loads(run.read_text()), "_dir": str(run.parent)}


def resample_check(run: Path, card_dir: Path, fractions: list[float], n: int, detector: str | None = None) -> list[dict]:
    """Subsets of one audited target at each fraction: the estimator's error and coverage
    (with the audit's primary detector, or ``detector``: a weaker one shows the error grow)."""
    from leakray.detect.card import DetectorCard
    from leakray.evaluate.prevalence import estimate_prevalence

    report = json.loads((run / "report.json").read_text())
    primary = detector or report["summary"]["primary_detector"]
    card = DetectorCard(card_dir)
    cal = card.calibrator(primary)
    val_y, val_s = card.val_scores(primary)
    s = pq.read_table(run / "scores.parquet").to_pandas()
    s = s[s["detector"] == primary]
    mem, non = s[s["member"] == 1]["score"].to_numpy(), s[s["member"] == 0]["score"].to_numpy()
    rng = np.random.default_rng(0)
    out = []
    for f in fractions:
        n_non = len(non) if f == 0 else min(len(non), int(len(mem) * (1 - f) / f))
        n_mem = int(round(f / (1 - f) * n_non)) if f < 1 else len(mem)
        errs, cover = [], []
        for _ in range(n):
            pick = np.r_[rng.choice(mem, n_mem, replace=False), rng.choice(non, n_non, replace=False)]
            truth = n_mem / (n_mem + n_non)
            e = estimate_prevalence(pick, val_y, val_s, cal.predict, n_boot=200, seed=int(rng.integers(1 << 30)))
            errs.append(e["estimate"] - truth)
            cover.append(e["ci"][0] <= truth <= e["ci"][1])
        out.append({"detector": primary, "fraction": round(n_mem / (n_mem + n_non), 3), "n": n_mem + n_non,
                    "resamples": n,
                    "mean_abs_error": round(float(np.mean(np.abs(errs))), 4), "bias": round(float(np.mean(errs)), 4),
                    "coverage": round(float(np.mean(cover)), 3)})
    return out


def markdown(r: dict) -> str:
    lines = ["| planted fraction | member seed | estimate | 95% CI | EM | raw flagged share | truth in CI | error |",
             "|---|---|---|---|---|---|---|---|"]
    for a in r["audits"]:
        lines.append(f"| {a['truth']:.1%} | {a['seed']} | {a['estimate']:.1%} | {a['ci'][0]:.1%}–{a['ci'][1]:.1%} | "
                     f"{a['em']:.1%} | {a['classify_and_count']:.1%} | {'yes' if a['covered'] else 'NO'} | "
                     f"{a['error'] * 100:+.1f} pts |")
    lines += ["", "Resampled from the largest planted fraction's target:", "",
              "| detector | fraction | samples | resamples | mean abs error | bias | CI coverage |",
              "|---|---|---|---|---|---|---|"]
    for x in r["resampled"]:
        lines.append(f"| {x.get('detector', '–')} | {x['fraction']:.1%} | {x['n']} | {x['resamples']} | "
                     f"{x['mean_abs_error'] * 100:.1f} pts | "
                     f"{x['bias'] * 100:+.1f} pts | {x['coverage']:.0%} |")
    lines += ["", f"card built in {r['card_seconds']} s; total {r['total_seconds']} s; overrides {r['overrides']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
