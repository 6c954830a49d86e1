"""`next_token` calibrated by a reference model the auditor runs: the target's log share of
agreeing draws minus the reference model's at the same cuts. A leak raises the target's
agreement on the leaked solutions only; code any model predicts well (boilerplate, short
solutions) raises both. The target is still read through text alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.probe_features import next_stats
from leakray.schema import C


class NextTokenCalibrated(ScoreOnly):
    spec = DetectorSpec("next_token_calibrated", "leakray (difficulty calibration as Carlini et al. 2021)",
                        (C.PROMPT, C.REFERENCE, C.NEXT_CUTS, C.NEXT_DRAWS, C.REFMODEL_NEXT_DRAWS), "black box",
                        "generation", False,
                        "next_token's statistic minus the same statistic of the reference model's draws at the cuts")
    reference_column = C.REFMODEL_NEXT_DRAWS

    def score(self, table: pa.Table) -> np.ndarray:
        return next_stats(table) - next_stats(table, self.reference_column)
