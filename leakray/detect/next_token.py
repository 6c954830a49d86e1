"""Sampled next-token agreement: how often the model's one-token continuations at the reference's
token starts are the reference's own next token (``leakray.features.probes``, probe "next"). Text
only, yet a likelihood: the share of agreeing draws estimates the probability the model gives
the reference's next token, which exposure raises even where greedy decoding never shows it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.probe_features import next_stats
from leakray.schema import C


class NextToken(ScoreOnly):
    spec = DetectorSpec("next_token", "leakray (n-gram accuracy, Xu et al. 2024, read through sampled draws)",
                        (C.PROMPT, C.REFERENCE, C.NEXT_CUTS, C.NEXT_DRAWS), "black box", "generation", False,
                        "mean over up to 64 token starts of the reference of the log share of 128 one-token samples "
                        "(temperature 1) that are the reference's next token")

    def score(self, table: pa.Table) -> np.ndarray:
        return next_stats(table)
