"""Reference-prefix completion (n-gram accuracy, Xu et al. 2024): how much of the reference's rest
the model writes when handed its head, at three cut points."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.probe_features import PREFIX_STATS, prefix_stats
from leakray.errors import BadInput
from leakray.schema import C


class PrefixCompletion(ScoreOnly):
    spec = DetectorSpec("prefix_completion", "Xu et al. 2024, Benchmarking Benchmark Leakage in LLMs (n-gram accuracy)",
                        (C.PROMPT, C.REFERENCE, C.PREFIX_CUTS, C.PREFIX_COMPLETIONS), "black box", "generation", False,
                        "mean over 3 cut points of the greedy continuation's match to the reference's rest "
                        "(exact next 5-gram, common-prefix share, edit similarity over 32 code tokens; their mean)")
    defaults = {"statistic": "mean"}  # one of PREFIX_STATS, or their mean

    def __init__(self, **params):
        super().__init__(**params)
        if self.params["statistic"] not in (*PREFIX_STATS, "mean"):
            raise BadInput(f"prefix_completion: statistic must be one of {(*PREFIX_STATS, 'mean')}",
                           field="detect.params.prefix_completion.statistic")

    def score(self, table: pa.Table) -> np.ndarray:
        x = prefix_stats(table)
        stat = self.params["statistic"]
        return x.mean(axis=1) if stat == "mean" else x[:, PREFIX_STATS.index(stat)]
