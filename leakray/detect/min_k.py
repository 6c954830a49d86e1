"""Min-K% Prob (Shi et al., ICLR 2024): the mean log-probability of the k% least likely
reference tokens; a member has few very unlikely tokens, so a higher mean = member."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import ragged_column
from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.errors import BadInput
from leakray.schema import C


def lowest_share_mean(values: np.ndarray, share: float) -> float:
    """Mean of the ceil(share * n) smallest values (at least one), as the published code
    takes the lowest k% of the token scores."""
    n = max(1, math.ceil(share * len(values)))
    return float(np.partition(values, n - 1)[:n].mean())


def check_share(share: float, name: str) -> float:
    share = float(share)
    if not 0.0 < share <= 1.0:
        raise BadInput(f"{name}: k must lie in (0, 1], got {share}", field=f"detect.params.{name}.k")
    return share


class MinK(ScoreOnly):
    spec = DetectorSpec("min_k", "Shi et al., ICLR 2024 (Min-K% Prob)", (C.REF_TOKEN_LOGPROBS,), "logprobs",
                        "likelihood", False, "mean log p of the lowest k% reference tokens (k = 20%)")
    defaults = {"k": 0.2}

    def score(self, table: pa.Table) -> np.ndarray:
        k = check_share(self.params["k"], self.spec.name)
        rows = ragged_column(table, C.REF_TOKEN_LOGPROBS)
        return np.asarray([lowest_share_mean(r, k) for r in rows], dtype=np.float64)
