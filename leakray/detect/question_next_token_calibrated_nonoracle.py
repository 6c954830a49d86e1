"""`question_next_token_calibrated` against the non-oracle reference model (simulate's
`columns.nonoracle_reference`): what an auditor without the target's pre-leak checkpoint gets."""

from __future__ import annotations

from leakray.detect.base import DetectorSpec
from leakray.detect.question_next_token_calibrated import QuestionNextTokenCalibrated
from leakray.schema import C


class QuestionNextTokenCalibratedNonOracle(QuestionNextTokenCalibrated):
    spec = DetectorSpec("question_next_token_calibrated_nonoracle",
                        "leakray (difficulty calibration as Carlini et al. 2021)",
                        (C.PROMPT, C.REFERENCE, C.QUESTION_CUTS, C.QUESTION_DRAWS, C.REFALT_QUESTION_DRAWS),
                        "black box", "generation", False,
                        "question_next_token_calibrated against a reference model that is not the target's "
                        "pre-leak checkpoint")
    reference_column = C.REFALT_QUESTION_DRAWS
