"""The text-only composite's `pooled` combiner before and after it averaged the probes' readings only.

    python benchmarks/pooled_readings.py SWEEP_OUT [SWEEP_OUT ...] [--seeds 0 1 2]

SWEEP_OUT is a `benchmarks/bench_dose_sweep.py` output whose collections hold both sampled probes
(`columns.probes=[next,question]`) and both reference models' draws (`columns.nonoracle_reference`);
a member split (`benchmark.fold_seed`) and dose met twice, in two outputs, is read once. Per run,
fitted on its shadow collection and scored on its target (AUC, members against non-members, the
mean over `--seeds`):

- `best fixed single`: `next_token_calibrated`, the text-only detector with the best mean over
  the splits measured before (docs/LEAK.md);
- `pooled, before`: the six sampled statistics (each probe's raw share and its calibrations
  against both references) with weight +1, and every other input with weight +-1 where its shadow
  AUC cleared chance by 1.96 null standard errors (what `leakray_combined`'s `pooled` still is);
- `pooled, now`: the combiner of `detect/combined.py` (each probe's draws against the
  collection's reference model; nothing else);
- `text_combined, before`: `auto` as it was: the combiner with the highest out-of-fold AUC on the
  shadow (logistic, unit, or `pooled` as it was; what `leakray_combined` still does);
- `text_combined, now`: `auto` as the detect stage runs it now: the simplest combiner within one
  standard error of the best out-of-fold AUC (`detect.combined.choose_combiner`), `pooled` as it is.

`text_combined, now` also gets its bootstrap 95% interval (`evaluate.metrics.binary_metrics`, the
detect stage's resamples; the median of the seeds' bounds), and `*` where it lies above 0.5.

Each in two views: the sweep's (the collection's reference model is the oracle, the target's
own checkpoint before the leak; tiny-alt the second) and an audit's (tiny-alt is the only
reference: its draws in the reference model's columns, the second reference's dropped).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

def text_combined_before(**params):
    """``text_combined`` as it was: ``pooled`` over the six sampled statistics with the screen, and
    ``auto`` keeping the highest out-of-fold AUC (what ``leakray_combined`` still does)."""
    from leakray.detect.combined import TextCombined

    class Before(TextCombined):
        pools_readings_only = False
        simplest_within_one_se = False

    return Before(**params)


def runs_once(sweeps: list[Path]):
    """(run directory, its target collection, dose, member split) of every run under ``sweeps``, a
    split and dose met twice (one sweep's runs adopted by another's output) read once."""
    seen = set()
    for sweep in sweeps:
        for coll in sorted(sweep.glob("**/collect_target/collection.parquet")):
            run = coll.parent.parent
            config = json.loads((run / "config.json").read_text())
            dose, split = config["leak"]["dose"], config["benchmark"].get("fold_seed")
            if (dose, split) not in seen:
                seen.add((dose, split))
                yield run, coll, dose, split


def score_fits(fits: dict, shadow, target, y, seed: int, got: dict) -> None:
    """Fit each of ``fits`` (column -> detector) on ``shadow`` with ``seed``; append its target AUC to ``got``."""
    from sklearn.metrics import roc_auc_score

    for col, det in fits.items():
        got[col].append(roc_auc_score(y, det.fit(shadow, seed).score(target)))


def auc_interval(y, score) -> tuple[float, float]:
    """The AUC's bootstrap 95% interval as the detect stage computes it (`evaluate.metrics.binary_metrics`)."""
    from leakray.evaluate.metrics import binary_metrics

    return tuple(binary_metrics(y, score, (score > np.median(score)).astype(int))["auc_ci"])


def audit_view(table):
    """The collection as an audit would have it: tiny-alt is the reference model."""
    from leakray.schema import C

    for own, alt in ((C.REFMODEL_NEXT_DRAWS, C.REFALT_NEXT_DRAWS), (C.REFMODEL_QUESTION_DRAWS, C.REFALT_QUESTION_DRAWS)):
        table = table.set_column(table.schema.get_field_index(own), own, table.column(alt))
    return table.drop_columns([C.REFALT_NEXT_DRAWS, C.REFALT_QUESTION_DRAWS])


def main() -> None:
    import pyarrow.parquet as pq
    from sklearn.metrics import roc_auc_score

    from leakray.detect import registry
    from leakray.schema import C

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    cols = ("best fixed single", "pooled, before", "pooled, now", "text_combined, before", "text_combined, now")
    print("| run | dose | view | " + " | ".join(cols) + " | auto chose before / now |")
    print("|---" * (len(cols) + 4) + "|")
    means: dict[tuple, list] = {}
    for run, coll, dose, _ in runs_once(args.sweeps):
        shadow0, target0 = pq.read_table(run / "collect_shadow" / "collection.parquet"), pq.read_table(coll)
        for view in ("sweep", "audit"):
            shadow, target = (shadow0, target0) if view == "sweep" else (audit_view(shadow0), audit_view(target0))
            y = target.column(C.MEMBER).to_numpy()
            got = {c: [] for c in cols}
            chose, lows, highs = [], [], []
            for seed in args.seeds:
                fits = {"pooled, before": text_combined_before(combiner="pooled"),
                        "pooled, now": registry.make("text_combined", {"combiner": "pooled"}),
                        "text_combined, before": text_combined_before(),
                        "text_combined, now": registry.make("text_combined")}
                got["best fixed single"].append(roc_auc_score(y, registry.make("next_token_calibrated").score(target)))
                score_fits(fits, shadow, target, y, seed, got)
                lo, hi = auc_interval(y, fits["text_combined, now"].score(target))
                lows.append(lo)
                highs.append(hi)
                chose.append(f"{fits['text_combined, before'].info['combiner'][0]}/"
                             f"{fits['text_combined, now'].info['combiner'][0]}")
            row = [float(np.mean(got[c])) for c in cols]
            means.setdefault((dose, view), []).append(row)
            ci = f" [{np.median(lows):.2f}, {np.median(highs):.2f}]{'*' if np.median(lows) > 0.5 else ''}"
            print(f"| {run.name} | {dose} | {view} | " + " | ".join(f"{v:.3f}" for v in row)
                  + f"{ci} | {' '.join(chose)} |", flush=True)
    print("\nMean over the runs:\n\n| dose | view | " + " | ".join(cols) + " | runs |\n" + "|---" * (len(cols) + 3) + "|")
    for (dose, view), rows in sorted(means.items()):
        print(f"| {dose} | {view} | " + " | ".join(f"{v:.3f}" for v in np.mean(rows, 0)) + f" | {len(rows)} |")


if __name__ == "__main__":
    main()
