"""Reference-model calibration over the whole sample: `ref_calibrated`'s likelihood ratio taken over
the prompt *and* the solution, per character. A model that read a benchmark sample in training
read its docstring too, and HumanEval's docstrings are longer than its solutions: on a tiny model
that read a quarter of HumanEval 16 times among clean code, this statistic separated members at
AUC 0.93 against its own pre-leak checkpoint, the solution alone at 0.84. Per character because
the reference model may tokenize differently (a string's log-probability compares across
tokenizers). The same statistic as the audit's self-calibrated route (`evaluate.selfcal`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.evaluate.selfcal import likelihood_ratio
from leakray.schema import C


class RefCalibratedText(ScoreOnly):
    spec = DetectorSpec("ref_calibrated_text", "Carlini et al., USENIX Security 2021 (over prompt and solution)",
                        (C.REF_TOKEN_LOGPROBS, C.REFMODEL_TOKEN_LOGPROBS, C.PROMPT_LOGPROB, C.REFMODEL_PROMPT_LOGPROB),
                        "logprobs", "likelihood", False,
                        "(log p(target) - log p(reference model)) of prompt + solution, per character")

    def score(self, table: pa.Table) -> np.ndarray:
        return np.asarray(likelihood_ratio(table, text="whole", keep_partial=True)["s"], dtype=np.float64)
