"""Reference-model calibration (Carlini et al. 2021; Watson et al., ICLR 2022): the target
model's loss on the reference continuation minus a reference model's loss on the same
tokens. Calibration removes how easy the text is for any model; what remains is what the
target learned. Lower difference = member, so the score is reference loss - target loss.

The reference model need not share the target's tokenizer (an audit's reference never is the
target's own checkpoint): the score is the whole text's log-likelihood ratio per target token,
(sum log p_target - sum log p_reference) / n_target_tokens. With one tokenizer this is exactly
mean log p_target - mean log p_reference, the published definition."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import ragged_column
from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.schema import C


class RefCalibrated(ScoreOnly):
    spec = DetectorSpec("ref_calibrated", "Carlini et al., USENIX Security 2021; Watson et al., ICLR 2022",
                        (C.REF_TOKEN_LOGPROBS, C.REFMODEL_TOKEN_LOGPROBS), "logprobs", "likelihood", False,
                        "(sum log p(target) - sum log p(reference model)) / target tokens, over the reference")

    reference_column = C.REFMODEL_TOKEN_LOGPROBS

    def score(self, table: pa.Table) -> np.ndarray:
        target = ragged_column(table, C.REF_TOKEN_LOGPROBS)
        ref = ragged_column(table, self.reference_column)
        return np.asarray([(t.sum() - r.sum()) / len(t) for t, r in zip(target, ref)], dtype=np.float64)
