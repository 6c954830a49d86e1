"""Reference-model calibration (Carlini et al. 2021; Watson et al., ICLR 2022): the target
model's loss on the reference continuation minus a reference model's loss on the same
tokens. Calibration removes how easy the text is for any model; what remains is what the
target learned. Lower difference = member, so the score is reference loss - target loss."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import ragged_column, same_lengths
from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.schema import C


class RefCalibrated(ScoreOnly):
    spec = DetectorSpec("ref_calibrated", "Carlini et al., USENIX Security 2021; Watson et al., ICLR 2022",
                        (C.REF_TOKEN_LOGPROBS, C.REFMODEL_TOKEN_LOGPROBS), "logprobs", "likelihood", False,
                        "mean log p(target) - mean log p(reference model) over the reference tokens")

    def score(self, table: pa.Table) -> np.ndarray:
        target = ragged_column(table, C.REF_TOKEN_LOGPROBS)
        ref = ragged_column(table, C.REFMODEL_TOKEN_LOGPROBS)
        same_lengths(target, ref, C.REF_TOKEN_LOGPROBS, C.REFMODEL_TOKEN_LOGPROBS)
        return np.asarray([t.mean() - r.mean() for t, r in zip(target, ref)], dtype=np.float64)
