"""Reference-model calibration with a reference a real audit could have: the same statistic as
`ref_calibrated`, against a second reference model that is *not* the target's own pre-leak
checkpoint (simulate's `columns.nonoracle_reference`, by default the other local architecture).
Side by side with `ref_calibrated` (the oracle reference) it shows how much of that detector's
power came from the oracle."""

from __future__ import annotations

from leakray.detect.base import DetectorSpec
from leakray.detect.ref_calibrated import RefCalibrated
from leakray.schema import C


class RefCalibratedNonOracle(RefCalibrated):
    spec = DetectorSpec("ref_calibrated_nonoracle", "Carlini et al., USENIX Security 2021; Watson et al., ICLR 2022",
                        (C.REF_TOKEN_LOGPROBS, C.REFALT_TOKEN_LOGPROBS), "logprobs", "likelihood", False,
                        "ref_calibrated against a reference model that is not the target's pre-leak checkpoint")
    reference_column = C.REFALT_TOKEN_LOGPROBS
