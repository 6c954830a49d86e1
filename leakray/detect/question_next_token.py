"""Sampled next-token agreement over the question: `next_token`'s statistic at up to 64 token
starts of the prompt itself (signature, docstring, examples), given only the prompt's text before
each cut (``leakray.features.probes``, probe "question"). A model that read a benchmark's sample
read its question too; these cuts are other positions than `next_token`'s, so the two read the
same exposure with independent noise, and a composite of both gains what neither has alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.probe_features import next_stats
from leakray.schema import C


class QuestionNextToken(ScoreOnly):
    spec = DetectorSpec("question_next_token", "leakray (n-gram accuracy over the question, Xu et al. 2024, "
                        "read through sampled draws)",
                        (C.PROMPT, C.REFERENCE, C.QUESTION_CUTS, C.QUESTION_DRAWS), "black box", "generation", False,
                        "mean over up to 64 token starts of the prompt of the log share of 128 one-token samples "
                        "(temperature 1) that are the prompt's next token")

    def score(self, table: pa.Table) -> np.ndarray:
        return next_stats(table, C.QUESTION_DRAWS, probe="question")
