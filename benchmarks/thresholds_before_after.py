"""Precision / recall / MCC of a finished run under the old decision rules and the new ones,
side by side, from the same scores (`<run>/detect/scores.parquet`).

Old (before issue 12): seed-free detectors labelled the top half of the *target's* rows as
members (using the target's own scores and its known 50% member share); CGMIA used 0.5.
New: every threshold chosen on shadow data (the run's `detect.threshold_rule`).

    python benchmarks/thresholds_before_after.py runs/humaneval-<hash>
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from sklearn.metrics import matthews_corrcoef, precision_score, recall_score

from leakray.schema import S

PROBABILITY_DETECTORS = ("cgmia", "cgmia_ensemble", "advprompt", "advprompt_graybox")


def old_prediction(name: str, score: np.ndarray) -> np.ndarray:
    if name in PROBABILITY_DETECTORS:
        return (score >= 0.5).astype(int)
    order = np.argsort(-score, kind="stable")  # the old rank_split: top floor(n/2) of the target
    pred = np.zeros(len(score), dtype=int)
    pred[order[: len(score) // 2]] = 1
    return pred


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    args = p.parse_args()
    scores = pq.read_table(args.run_dir / "detect" / "scores.parquet").to_pandas()
    rule = json.loads((args.run_dir / "detect" / "metrics.json").read_text()).get("threshold_rule")
    print(f"{'detector':18} {'old P':>6} {'old R':>6} {'old MCC':>8} | {'new P':>6} {'new R':>6} {'new MCC':>8}"
          f"   (new rule: {rule})")
    rows = []
    for name, group in scores.groupby(S.DETECTOR):
        old, new = [], []
        for _, seed in group.groupby(S.SEED):
            y, s = seed[S.MEMBER].to_numpy(), seed[S.SCORE].to_numpy()
            for pred, out in ((old_prediction(name, s), old), (seed[S.PREDICTION].to_numpy(), new)):
                out.append((precision_score(y, pred, zero_division=0), recall_score(y, pred, zero_division=0),
                            matthews_corrcoef(y, pred)))
        rows.append((name, np.median(old, axis=0), np.median(new, axis=0)))
    for name, o, n in sorted(rows, key=lambda r: -r[2][2]):
        print(f"{name:18} {o[0]:6.3f} {o[1]:6.3f} {o[2]:8.3f} | {n[0]:6.3f} {n[1]:6.3f} {n[2]:8.3f}")


if __name__ == "__main__":
    main()
