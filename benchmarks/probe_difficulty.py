"""The sampled probes' calibration as a difference (what `next_token_calibrated` and
`question_next_token_calibrated` compute) against the same difference net of difficulty (a Huber
regression on the reference model's own reading and the solution's log length, fitted on the
target's tasks without labels: `evaluate.selfcal.net_of_difficulty`, the audit routes'
adjustment), per member split and dose, on stored dose-sweep collections.

    python benchmarks/probe_difficulty.py SWEEP_OUT [SWEEP_OUT ...]

SWEEP_OUT as for `benchmarks/pooled_readings.py` (both probes, both references' draws). Per run:
target AUC of each probe's calibration against the oracle reference (the target's checkpoint before
the leak) and against tiny-alt (`alt`, what an audit has), as a difference (`diff`), net of
difficulty (`net`), and net of length alone (`netlenonly`); `pair` adds the two probes' readings,
each standardised over the target's tasks. Results: docs/LEAK.md, "The probes net of difficulty".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PROBES = ("next", "question")
REFERENCES = ("oracle", "alt")


def readings(table) -> dict[str, np.ndarray]:
    """Every variant's per-task score on one target collection."""
    from leakray.data.tasks import continuation
    from leakray.detect.probe_features import next_stats
    from leakray.evaluate.selfcal import net_of_difficulty
    from leakray.schema import C

    columns = {"next": (C.NEXT_DRAWS, C.REFMODEL_NEXT_DRAWS, C.REFALT_NEXT_DRAWS),
               "question": (C.QUESTION_DRAWS, C.REFMODEL_QUESTION_DRAWS, C.REFALT_QUESTION_DRAWS)}
    chars = np.array([len(continuation(p, r)) for p, r in
                      zip(table.column(C.PROMPT).to_pylist(), table.column(C.REFERENCE).to_pylist())])
    out = {}
    for probe in PROBES:
        own, oracle, alt = columns[probe]
        s = next_stats(table, own, probe)
        for ref, column in zip(REFERENCES, (oracle, alt)):
            r = next_stats(table, column, probe)
            diff = s - r
            out[f"{probe}/{ref}/diff"] = diff
            out[f"{probe}/{ref}/net"] = net_of_difficulty(diff, r, chars)[0]
            out[f"{probe}/{ref}/netlenonly"] = net_of_difficulty(diff, np.zeros_like(r), chars)[0]
    z = lambda v: (v - v.mean()) / v.std()  # noqa: E731  (over the target's tasks: no labels)
    for ref in REFERENCES:
        for kind in ("diff", "net"):
            out[f"pair/{ref}/{kind}"] = z(out[f"next/{ref}/{kind}"]) + z(out[f"question/{ref}/{kind}"])
    return out


def main() -> None:
    import pyarrow.parquet as pq
    from pooled_readings import runs_once
    from sklearn.metrics import roc_auc_score

    from leakray.schema import C

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    args = ap.parse_args()
    rows: dict[int, list] = {}
    for _, coll, dose, split in runs_once(args.sweeps):
        table = pq.read_table(coll)
        y = table.column(C.MEMBER).to_numpy()
        rows.setdefault(dose, []).append((split, {k: roc_auc_score(y, v) for k, v in readings(table).items()}))
    for dose in sorted(rows):
        splits = [s for s, _ in rows[dose]]
        print(f"\n| dose {dose}: variant | mean | " + " | ".join(f"split {s}" for s in splits) + " |")
        print("|---" * (len(splits) + 2) + "|")
        for k in sorted(rows[dose][0][1]):
            vals = [r[k] for _, r in rows[dose]]
            print(f"| {k} | {np.mean(vals):.3f} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")


if __name__ == "__main__":
    main()
