"""Seed-free baseline detectors on a collection: DetectLeak PPL-rank, reference loss, GT-Match.

Each returns a float64 score per row (higher = member) and no decision: the decision
threshold is chosen on the shadow collection's scores and labels
(``leakray.evaluate.thresholds``) and applied to the target, never taken from the target.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import list_column, scalar_column
from leakray.schema import C


def _score(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def detectleak_scores(table: pa.Table) -> np.ndarray:
    """DetectLeak / PPL-rank: lower mean perplexity over the k completions = member."""
    ppl = list_column(table, C.PERPLEXITY, dtype=np.float64)
    return _score(-ppl.mean(axis=1))


def ref_loss_scores(table: pa.Table) -> np.ndarray:
    """Loss attack on the reference solution: lower mean token NLL = member."""
    return _score(-scalar_column(table, C.REF_LOSS))


def gt_match_scores(table: pa.Table) -> np.ndarray:
    """GT-Match style: the best of the k completions' token similarity to the reference."""
    ed = list_column(table, C.EDIT_DISTANCE, dtype=np.float64)
    return _score((1.0 - ed).max(axis=1))


BASELINES = {
    "detectleak": detectleak_scores,
    "ref_loss": ref_loss_scores,
    "gt_match": gt_match_scores,
}
