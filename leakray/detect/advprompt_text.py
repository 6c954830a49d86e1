"""AdvPrompt-MIA through text alone: the registry's ``advprompt`` (shadow setting, the same MLP,
training, folds and threshold) on its 14 embedding-similarity features only, so that an audit
of an endpoint that returns text and no log-probabilities can run it (issue 21).

The paper's 27 features are 14 similarities (the reference continuation's encoder embedding
against the unperturbed completion's and each of the 11 perturbed completions', their mean and
spread) and 13 relative perplexities of the perturbed completions, which need the target's
log-probabilities of its own samples. The similarities need only the completions' text: the
encoder is the auditor's. So this detector drops the 13 (``PERPLEXITY_FEATURES``) and does not
read the perplexity column at all; which kinds of variant it saw is in its card, as for
``advprompt``. On the fine-tune demo's collections its target AUC was about the full
detector's (docs/DETECTORS.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from leakray.detect import advprompt as ap
from leakray.detect.advprompt_mia import AdvPromptMIA
from leakray.detect.base import DetectorSpec
from leakray.schema import C


class AdvPromptText(AdvPromptMIA):
    spec = DetectorSpec("advprompt_text", "AdvPrompt-MIA (Jiang et al. 2025), its text-only features",
                        (C.ADV_EMBEDDING, C.ADV_KIND, C.REF_EMBEDDING), "black box", "learned", True,
                        "stability of greedy completions under 11 proven prompt perturbations, from the "
                        "completions' text alone (14 embedding similarities, no perplexity) -> MLP")

    def __init__(self, **params: Any):
        config = dict(params.get("config") or {})
        # whatever else a user drops, the perplexity features stay out: text cannot give them
        config["drop_features"] = sorted(set(config.get("drop_features") or ()) | set(ap.PERPLEXITY_FEATURES),
                                         key=ap.FEATURE_NAMES.index)
        super().__init__(**{**params, "config": config})

    def arrays(self, table: pa.Table) -> dict[str, np.ndarray]:
        return ap.arrays_from_table(table, perplexities=False)
