"""GT-Match: the best of the k completions' token similarity to the reference (1 - edit distance)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.baselines import gt_match_scores
from leakray.schema import C


class GTMatch(ScoreOnly):
    spec = DetectorSpec("gt_match", "leakray baseline (ground-truth match of the samples)", (C.EDIT_DISTANCE,),
                        "black box", "generation", False, "max over k completions of 1 - token edit distance")

    def score(self, table: pa.Table) -> np.ndarray:
        return gt_match_scores(table)
