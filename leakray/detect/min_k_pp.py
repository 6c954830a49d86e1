"""Min-K%++ (Zhang et al., ICLR 2025): each reference token's log-probability standardised by
the mean and standard deviation of log p over the vocabulary at its position,
(log p(x_t) - mu_t) / sigma_t; the score is the mean of the lowest k% (higher = member:
a trained-on token sits near a mode of the next-token distribution)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import ragged_column, same_lengths
from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.min_k import check_share, lowest_share_mean
from leakray.errors import BadInput
from leakray.schema import C


class MinKPlusPlus(ScoreOnly):
    spec = DetectorSpec("min_k_pp", "Zhang et al., ICLR 2025 (Min-K%++)",
                        (C.REF_TOKEN_LOGPROBS, C.REF_TOKEN_MU, C.REF_TOKEN_SIGMA), "logprobs", "likelihood", False,
                        "mean of the lowest k% of (log p - mu) / sigma over the reference tokens (k = 20%)")
    defaults = {"k": 0.2}

    def score(self, table: pa.Table) -> np.ndarray:
        k = check_share(self.params["k"], self.spec.name)
        lp = ragged_column(table, C.REF_TOKEN_LOGPROBS)
        mu = ragged_column(table, C.REF_TOKEN_MU)
        sigma = ragged_column(table, C.REF_TOKEN_SIGMA)
        same_lengths(lp, mu, C.REF_TOKEN_LOGPROBS, C.REF_TOKEN_MU)
        same_lengths(lp, sigma, C.REF_TOKEN_LOGPROBS, C.REF_TOKEN_SIGMA)
        out = np.empty(len(lp))
        for i, (a, m, s) in enumerate(zip(lp, mu, sigma)):
            if not np.all(s > 0):  # a one-hot next-token distribution: the z-score is undefined
                raise BadInput("sigma must be > 0 at every position", row=i, field=C.REF_TOKEN_SIGMA)
            out[i] = lowest_share_mean((a - m) / s, k)
        return out
