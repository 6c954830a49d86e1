"""DetectLeak (Zhou et al. 2025, PPL-rank): lower mean perplexity of the k completions = member."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.baselines import detectleak_scores
from leakray.schema import C


class DetectLeak(ScoreOnly):
    spec = DetectorSpec("detectleak", "Zhou et al. 2025 (DetectLeak / LessLeak)", (C.PERPLEXITY,), "sampled logprobs",
                        "generation", False, "-(mean perplexity of the k completions)")

    def score(self, table: pa.Table) -> np.ndarray:
        return detectleak_scores(table)
