"""Why a faint leak gets no share from the target's own scores: the members' and the clean tasks'
score distributions on the audit matrix's control-route targets, and two estimators tried on them.

    python benchmarks/audit_matrix.py --output OUT --only ctrl-clean,ctrl-mix-d16,ctrl-mix-d4,ctrl-twin-20
    python benchmarks/faint_leak_shapes.py OUT

Per target, over the statistic the routes use (the likelihood ratio to the reference model per
character of prompt + solution), raw and net of the task's difficulty (`adjust_for_difficulty`,
fitted on all tasks pooled, no label read):
- the clean tasks' mean, sd and skew, the members' mean and sd, the members' AUC and their
  distance from the clean mean in clean sds (d);
- the self-calibrated route's fit (`selfcal.empirical_null`) on the audited tasks: one normal or a
  mixture, and its share;
- a mixture whose null is pinned by the control tasks (they are N(mu0, sd0) too, fitted jointly)
  and whose member component is free: the share with a 200-resample bootstrap interval.
The truth comes from each target's truth.json (none: a clean base)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from scipy import stats
from sklearn.metrics import roc_auc_score

from leakray.evaluate import control_route, selfcal


def pinned_null_share(x: np.ndarray, control: np.ndarray, iters: int = 2000) -> float:
    """EM for x ~ pi0 N(m0, s0) + (1 - pi0) N(m1, s1) with control ~ N(m0, s0): the share 1 - pi0."""
    m0, s0 = float(np.median(np.r_[x, control])), float(np.std(control))
    pi0, m1, s1 = 0.8, m0 + 2 * s0, s0
    for _ in range(iters):
        f0, f1 = pi0 * stats.norm.pdf(x, m0, s0), (1 - pi0) * stats.norm.pdf(x, m1, s1)
        r0 = f0 / np.maximum(f0 + f1, 1e-300)
        r1 = 1 - r0
        new = float(r0.mean())
        w, z = np.r_[r0, np.ones(len(control))], np.r_[x, control]
        m0 = float((w * z).sum() / w.sum())
        s0 = max(float(np.sqrt((w * (z - m0) ** 2).sum() / w.sum())), 1e-6)
        if r1.sum() > 1e-6:
            m1 = float((r1 * x).sum() / r1.sum())
            s1 = max(float(np.sqrt((r1 * (x - m1) ** 2).sum() / r1.sum())), 0.3 * s0)
        m1 = max(m1, m0)
        done, pi0 = abs(new - pi0) < 1e-9, new
        if done:
            break
    return 1 - pi0


def shapes(run: Path) -> list[str]:
    report = json.loads((run / "report.json").read_text())
    target = Path(report["summary"]["target"])
    truth = target / "truth.json"
    members = set(json.loads(truth.read_text())["members"]) if truth.exists() else set()
    st = control_route.statistics(pq.read_table(run / "control_scores" / "control_scores.parquet"))
    b, c = st["benchmark"], st["control"]
    y = np.array([t in members for t in b["task_id"]])
    adjusted = control_route.adjust_for_difficulty(b["s"], c["s"], b["ref"], c["ref"], b["chars"], c["chars"])
    lines = []
    for label, (xb, xc) in (("raw", (b["s"], c["s"])), ("net of difficulty", adjusted[:2])):
        ok = np.isfinite(xb)
        xb, yb, xc = xb[ok], y[ok], xc[np.isfinite(xc)]
        clean, mem = xb[~yb], xb[yb]
        fit = selfcal.empirical_null(xb)
        rng = np.random.default_rng(0)
        share = pinned_null_share(xb, xc)
        boots = [pinned_null_share(xb[rng.integers(0, len(xb), len(xb))], xc[rng.integers(0, len(xc), len(xc))])
                 for _ in range(200)]
        lo, hi = np.percentile(boots, [2.5, 97.5])
        member_part = (f"members {mem.mean():+.3f} sd {mem.std():.3f}, AUC {roc_auc_score(yb, xb):.3f}, "
                       f"d {(mem.mean() - clean.mean()) / clean.std():.2f}" if len(mem) else "no members")
        fitted = "one normal" if fit["components"] == 1 else f"mixture, {1 - fit['pi0']:.1%}"
        lines.append(f"| {target.name} | {label} | {yb.mean():.1%} | clean {clean.mean():+.3f} sd {clean.std():.3f} "
                     f"skew {stats.skew(clean):+.2f}; {member_part} | {fitted} | {share:.1%} [{lo:.1%}, {hi:.1%}] |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("matrix", type=Path, help="benchmarks/audit_matrix.py's --output with the ctrl-* rows")
    args = ap.parse_args()
    runs = sorted(p.parent.parent for p in args.matrix.glob("runs/audit-*/control_scores/control_scores.parquet"))
    if not runs:
        raise SystemExit(f"no audit with control scores under {args.matrix}/runs (run the ctrl-* rows first)")
    print("| target | statistic | truth | score shapes | self-calibrated fit | share, null pinned by the control "
          "tasks [95% CI] |\n|---|---|---|---|---|---|")
    for run in runs:
        print("\n".join(shapes(run)))


if __name__ == "__main__":
    main()
