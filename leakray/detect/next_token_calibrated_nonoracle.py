"""`next_token_calibrated` against the non-oracle reference model (simulate's
`columns.nonoracle_reference`): what an auditor without the target's pre-leak checkpoint gets."""

from __future__ import annotations

from leakray.detect.base import DetectorSpec
from leakray.detect.next_token_calibrated import NextTokenCalibrated
from leakray.schema import C


class NextTokenCalibratedNonOracle(NextTokenCalibrated):
    spec = DetectorSpec("next_token_calibrated_nonoracle", "leakray (difficulty calibration as Carlini et al. 2021)",
                        (C.PROMPT, C.REFERENCE, C.NEXT_CUTS, C.NEXT_DRAWS, C.REFALT_NEXT_DRAWS), "black box",
                        "generation", False,
                        "next_token_calibrated against a reference model that is not the target's pre-leak checkpoint")
    reference_column = C.REFALT_NEXT_DRAWS
