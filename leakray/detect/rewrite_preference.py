"""Original-vs-rewrite preference (in the spirit of the Data Contamination Quiz, Golchin & Surdeanu
2024): the greedy completion of the prompt lands nearer the reference than nearer rewrites of it
that rename the solution's locals to other natural names, when the model read the original."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.probe_features import GREEDY_STATS, greedy_stats
from leakray.errors import BadInput
from leakray.schema import C


class RewritePreference(ScoreOnly):
    spec = DetectorSpec("rewrite_preference", "after Golchin & Surdeanu, ICLR 2024 (Data Contamination Quiz)",
                        (C.PROMPT, C.REFERENCE, C.GREEDY_COMPLETION, C.REWRITES), "black box", "generation", False,
                        "token similarity of the greedy completion to the reference minus its mean similarity "
                        "to 4 rewrites renaming the solution's locals (0 where none can be renamed)")
    defaults = {"statistic": "preference"}  # or "original": the similarity to the reference alone

    def __init__(self, **params):
        super().__init__(**params)
        if self.params["statistic"] not in GREEDY_STATS:
            raise BadInput(f"rewrite_preference: statistic must be one of {GREEDY_STATS}",
                           field="detect.params.rewrite_preference.statistic")

    def score(self, table: pa.Table) -> np.ndarray:
        return greedy_stats(table)[:, GREEDY_STATS.index(self.params["statistic"])]
