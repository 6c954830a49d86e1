"""Masked-span guessing (TS-Guessing, Deng et al. 2024) for a completion-only model: the reference
is cut right before a distinctive identifier (or line) and the model's next word is compared with it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.probe_features import mask_stats
from leakray.schema import C


class MaskedSpan(ScoreOnly):
    spec = DetectorSpec("masked_span", "Deng et al., NAACL 2024 (TS-Guessing), as continuation before the mask",
                        (C.MASK_SPANS, C.MASK_COMPLETIONS), "black box", "generation", False,
                        "mean over up to 3 hidden spans (the solution's longest new identifiers, else lines) "
                        "of the share the greedy continuation before each restores (1 = exact)")

    def score(self, table: pa.Table) -> np.ndarray:
        return mask_stats(table)
