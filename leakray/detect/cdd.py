"""CDD (Dong et al., ACL Findings 2024, "Generalization or Memorization"): contamination
makes the output distribution peaked, so sampled outputs sit close to each other.

Published statistic: with edit distances d_i = ED(s_i, s_greedy) between each sampled
output and the greedy output, and l = the longest sample's length in tokens,
``peak = share of samples with d_i <= alpha * l`` (alpha = 0.05 in the paper); the
higher the share, the more likely contaminated.

The collection holds k temperature samples and no greedy output, so the anchor is
replaced by every sample in turn: ``peak = share of the k(k-1)/2 sample pairs with
ED(s_i, s_j) <= alpha * l``. A peaked distribution concentrates pairs near each other
exactly as it concentrates samples near its mode. Edit distance is the token-level
Levenshtein distance over leakray's language-agnostic code tokens (``code_tokens``),
unnormalised, as in the paper; ``l`` counts the same tokens.

The score takes few distinct values for small k (10 pairs for k = 5), so ranking metrics
see many ties; that is the published statistic, not smoothed here.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pyarrow as pa
from rapidfuzz.distance import Levenshtein

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.errors import BadInput
from leakray.features.expert import code_tokens
from leakray.schema import C


def _ids(tokens: list[str], vocab: dict[str, int]) -> list[int]:
    return [vocab.setdefault(t, len(vocab)) for t in tokens]


def peakedness(samples: list[str], alpha: float) -> float:
    """Share of sample pairs within token edit distance alpha * (longest sample's token count)."""
    vocab: dict[str, int] = {}
    seqs = [_ids(code_tokens(s), vocab) for s in samples]
    bound = alpha * max(len(s) for s in seqs)
    pairs = list(combinations(range(len(seqs)), 2))
    close = sum(Levenshtein.distance(seqs[i], seqs[j]) <= bound for i, j in pairs)
    return close / len(pairs)


class CDD(ScoreOnly):
    spec = DetectorSpec("cdd", "Dong et al., Findings of ACL 2024 (CDD)", (C.COMPLETIONS,), "black box",
                        "generation", False, "share of completion pairs within token edit distance alpha * max length")
    defaults = {"alpha": 0.05}

    def score(self, table: pa.Table) -> np.ndarray:
        alpha = float(self.params["alpha"])
        if not 0.0 <= alpha <= 1.0:
            raise BadInput(f"cdd: alpha must lie in [0, 1], got {alpha}", field="detect.params.cdd.alpha")
        out = np.empty(table.num_rows)
        for i, samples in enumerate(table.column(C.COMPLETIONS).to_pylist()):
            if samples is None or len(samples) < 2 or any(s is None for s in samples):
                raise BadInput("CDD needs at least 2 non-null completions", row=i, field=C.COMPLETIONS)
            out[i] = peakedness(samples, alpha)
        return out
