"""Does the all-access composite (`leakray_combined`) add to the exact likelihood ratios it combines?
Its design against a simpler one that averages only those ratios.

    python benchmarks/combined_readings.py SWEEP_OUT [SWEEP_OUT ...] [--seeds 0 1 2]

SWEEP_OUT is a `benchmarks/bench_dose_sweep.py` output (`columns.probes=[next,question]`,
`columns.nonoracle_reference`); a member split (`benchmark.fold_seed`) and dose met twice, in two
outputs, is read once. Per run, fitted on its shadow collection and scored on its target (AUC,
members against non-members, the mean over `--seeds`):

- `ref_calibrated`, `ref_calibrated_text`: the exact likelihood ratios against the reference model,
  the solution's per token and the whole sample's per character (single detectors, nothing fitted);
- `leakray_combined`: as the detect stage runs it (`pooled` over the six sampled statistics plus a
  screen of every other input; `auto` keeps the highest out-of-fold AUC), with its bootstrap 95%
  interval (the median of the seeds' bounds);
- `logistic`: its logistic regression over every input, alone;
- `readings`: the alternative, `text_combined`'s design applied to all access: `pooled` averages
  the two exact ratios (each standardised on the shadow, nothing else), and `auto` keeps the
  simplest combiner within one standard error of the best out-of-fold AUC.

Each in two views: the sweep's (the reference model is the oracle, the target's own checkpoint
before the leak) and an audit's (tiny-alt is the only reference). The sweeps stored tiny-alt's
token log-probabilities of the solutions but not of the prompts, so the audit view scores the
prompts with tiny-alt here, as the collection scores them (`HFSampler.reference_scores`). About a
minute for five splits of two doses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pooled_readings import auc_interval, runs_once, score_fits  # noqa: E402

EXACT = ("ref_calibrated", "ref_calibrated_text")


def readings_design(**params):
    """``leakray_combined`` with ``pooled`` over the exact ratios only and the one-SE ``auto``."""
    from leakray.detect.combined import Combined

    class Readings(Combined):
        pools_readings_only = True
        simplest_within_one_se = True

        def _pooled_inputs(self):
            have = {n for names in self.used.values() for n in names}
            return [n for n in EXACT if n in have]

    return Readings(**params)

_SAMPLERS: dict[str, tuple] = {}


def prompt_logprobs(run: Path, table, model: str) -> list[float | None]:
    """Per row, ``model``'s log-probability of the prompt as a collection scores it."""
    from leakray.models.backends import make_sampler
    from leakray.models.sampler import SampleConfig
    from leakray.schema import C

    if model not in _SAMPLERS:
        sample = json.loads((run / "config.json").read_text())["sample"]
        _SAMPLERS[model] = (make_sampler(model, SampleConfig(**{**sample, "backend": "hf"})), {})
    sampler, seen = _SAMPLERS[model]
    out = []
    for prompt, ref in zip(table.column(C.PROMPT).to_pylist(), table.column(C.REFERENCE).to_pylist()):
        if (prompt, ref) not in seen:
            (scores,) = sampler.reference_scores([prompt], [ref])
            seen[prompt, ref] = scores.context_logprob
        out.append(seen[prompt, ref])
    return out


def audit_view(run: Path, table):
    """The collection as an audit has it: tiny-alt (the sweep's non-oracle reference) is the reference
    model, for the likelihood ratios and the probes' draws; no second reference."""
    import pyarrow as pa

    from leakray.schema import C

    alt = json.loads((run / "report.json").read_text())["reference_models"]["nonoracle"]
    swaps = ((C.REFMODEL_TOKEN_LOGPROBS, table.column(C.REFALT_TOKEN_LOGPROBS)),
             (C.REFMODEL_PROMPT_LOGPROB, pa.array(prompt_logprobs(run, table, alt), pa.float64())),
             (C.REFMODEL_NEXT_DRAWS, table.column(C.REFALT_NEXT_DRAWS)),
             (C.REFMODEL_QUESTION_DRAWS, table.column(C.REFALT_QUESTION_DRAWS)))
    for name, column in swaps:
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table.drop_columns([C.REFALT_TOKEN_LOGPROBS, C.REFALT_NEXT_DRAWS, C.REFALT_QUESTION_DRAWS])


def main() -> None:
    import pyarrow.parquet as pq
    from sklearn.metrics import roc_auc_score

    from leakray.detect import registry
    from leakray.schema import C

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    singles = EXACT
    fitted = ("leakray_combined", "logistic", "readings")
    cols = singles + fitted
    print("| run | dose | split | view | " + " | ".join(cols) + " | leakray_combined's 95% interval | auto chose: leakray_combined / readings |")
    print("|---" * (len(cols) + 6) + "|")
    means = {}
    for run, coll, dose, split in runs_once(args.sweeps):
        if dose == 0:  # the control has no member to find
            continue
        shadow0, target0 = pq.read_table(run / "collect_shadow" / "collection.parquet"), pq.read_table(coll)
        for view in ("sweep", "audit"):
            shadow, target = (shadow0, target0) if view == "sweep" else \
                (audit_view(run, shadow0), audit_view(run, target0))
            y = target.column(C.MEMBER).to_numpy()
            got = {c: [roc_auc_score(y, registry.make(c).score(target))] for c in singles}
            got.update({c: [] for c in fitted})
            chose, lows, highs = [], [], []
            for seed in args.seeds:
                fits = {"leakray_combined": registry.make("leakray_combined"),
                        "logistic": registry.make("leakray_combined", {"combiner": "logistic"}),
                        "readings": readings_design()}
                score_fits(fits, shadow, target, y, seed, got)
                lo, hi = auc_interval(y, fits["leakray_combined"].score(target))
                lows.append(lo)
                highs.append(hi)
                chose.append(f"{fits['leakray_combined'].info['combiner'][0]}/{fits['readings'].info['combiner'][0]}")
            row = [float(np.mean(got[c])) for c in cols]
            means.setdefault((dose, view), []).append(row)
            print(f"| {run.name} | {dose} | {split} | {view} | " + " | ".join(f"{v:.3f}" for v in row)
                  + f" | [{np.median(lows):.2f}, {np.median(highs):.2f}] | {' '.join(chose)} |", flush=True)
    print("\nMean over the runs (`best single`: the better of the two ratios' means):\n\n| dose | view | "
          + " | ".join(cols) + " | best single | leakray_combined - best | readings - best | runs |\n"
          + "|---" * (len(cols) + 6) + "|")
    for (dose, view), rows in sorted(means.items()):
        m = np.mean(rows, 0)
        best = max(m[: len(singles)])
        print(f"| {dose} | {view} | " + " | ".join(f"{v:.3f}" for v in m)
              + f" | {best:.3f} | {m[cols.index('leakray_combined')] - best:+.3f} | {m[cols.index('readings')] - best:+.3f}"
              + f" | {len(rows)} |")


if __name__ == "__main__":
    main()
