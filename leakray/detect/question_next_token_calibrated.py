"""`question_next_token` calibrated by a reference model the auditor runs: the target's log share
of agreeing draws at the prompt's cuts minus the reference model's at the same cuts. Docstrings
and signatures any model predicts well raise both; a leak raises the target's alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.probe_features import next_stats
from leakray.schema import C


class QuestionNextTokenCalibrated(ScoreOnly):
    spec = DetectorSpec("question_next_token_calibrated", "leakray (difficulty calibration as Carlini et al. 2021)",
                        (C.PROMPT, C.REFERENCE, C.QUESTION_CUTS, C.QUESTION_DRAWS, C.REFMODEL_QUESTION_DRAWS),
                        "black box", "generation", False,
                        "question_next_token's statistic minus the same statistic of the reference model's draws")
    reference_column = C.REFMODEL_QUESTION_DRAWS

    def score(self, table: pa.Table) -> np.ndarray:
        return (next_stats(table, C.QUESTION_DRAWS, probe="question")
                - next_stats(table, self.reference_column, probe="question"))
