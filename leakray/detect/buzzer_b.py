"""BUZZER-b, case perturbation (after Buzzer; the CGMIA paper's reference [65]): a member's
completions rest on a memorised prompt, so upper-casing the prompt disturbs them more than
a non-member's.

Buzzer compares the model's [CLS] embedding before and after perturbation; a generation
collection has no such embedding, so the black-box analogue is the shift in how likely
the model finds its own completions:

    score = mean_k log PPL(completions of the upper-cased prompt)
          - mean_k log PPL(completions of the prompt)

Higher = more sensitive = member. Log perplexity (mean token NLL) rather than perplexity
because perplexity is multiplicative and a few long-tailed samples would dominate a mean
of raw values; both sides are the same k-sample means from the same sampler, so length
and sampling settings cancel. Perplexity rather than similarity to the reference because
it needs no reference (the auditor may not hold one) and no executed code.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import list_column
from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.errors import BadInput
from leakray.schema import C


def _log_ppl(table: pa.Table, name: str) -> np.ndarray:
    ppl = list_column(table, name, dtype=np.float64)
    bad = np.argwhere(ppl <= 0)
    if len(bad):
        raise BadInput("perplexity must be > 0", row=int(bad[0][0]), field=name)
    return np.log(ppl).mean(axis=1)


class BuzzerB(ScoreOnly):
    spec = DetectorSpec("buzzer_b", "after Buzzer (the CGMIA paper's ref. [65]): case perturbation",
                        (C.PERPLEXITY, C.UPPER_PERPLEXITY), "sampled logprobs", "generation", False,
                        "mean log PPL of upper-cased-prompt completions - mean log PPL of the completions")

    def score(self, table: pa.Table) -> np.ndarray:
        return _log_ppl(table, C.UPPER_PERPLEXITY) - _log_ppl(table, C.PERPLEXITY)
