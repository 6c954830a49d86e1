"""Seed-free baseline detectors on a collection: DetectLeak PPL-rank, reference loss, GT-Match.

Each returns ``{S.SCORE: float array (higher = member), S.PREDICTION: 0/1 array}``.
Predictions are a rank split: the floor(n/2) rows with the highest score are members;
ties are broken by row order (earlier row first), so the split is deterministic.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import list_column, scalar_column
from leakray.schema import C, S


def rank_split(score: np.ndarray) -> np.ndarray:
    """1 for the floor(n/2) highest scores (stable: ties go to the earlier row), else 0."""
    score = np.asarray(score, float)
    order = np.argsort(-score, kind="stable")
    pred = np.zeros(len(score), dtype=np.int8)
    pred[order[: len(score) // 2]] = 1
    return pred


def _result(score: np.ndarray) -> dict[str, np.ndarray]:
    score = np.asarray(score, dtype=np.float64)
    return {S.SCORE: score, S.PREDICTION: rank_split(score)}


def detectleak_scores(table: pa.Table) -> dict[str, np.ndarray]:
    """DetectLeak / PPL-rank: lower mean perplexity over the k completions = member."""
    ppl = list_column(table, C.PERPLEXITY, dtype=np.float64)
    return _result(-ppl.mean(axis=1))


def ref_loss_scores(table: pa.Table) -> dict[str, np.ndarray]:
    """Loss attack on the reference solution: lower mean token NLL = member."""
    return _result(-scalar_column(table, C.REF_LOSS))


def gt_match_scores(table: pa.Table) -> dict[str, np.ndarray]:
    """GT-Match style: the best of the k completions' token similarity to the reference."""
    ed = list_column(table, C.EDIT_DISTANCE, dtype=np.float64)
    return _result((1.0 - ed).max(axis=1))


BASELINES = {
    "detectleak": detectleak_scores,
    "ref_loss": ref_loss_scores,
    "gt_match": gt_match_scores,
}
