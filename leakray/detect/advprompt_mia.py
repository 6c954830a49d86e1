"""AdvPrompt-MIA as a registry detector (shadow setting): the MLP of ``detect.advprompt``
trained on the shadow collection's AdvPrompt columns, scored by its member log-odds
(``predict_log_odds``: its probability saturates at 1.0), its threshold chosen on out-of-fold
shadow log-odds (the same folds and seed as ``advprompt.cross_fit_log_odds``). Being in the
registry puts it in detector cards and audits like every other detector; its gray-box setting
(the auditor knows some target members) stays in ``protocols.advprompt_eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leakray.detect import advprompt as ap
from leakray.detect.base import Detector, DetectorSpec, labels
from leakray.errors import BadInput
from leakray.schema import C


class AdvPromptMIA(Detector):
    spec = DetectorSpec("advprompt", "AdvPrompt-MIA (Jiang et al. 2025)",
                        (C.ADV_EMBEDDING, C.ADV_PERPLEXITY, C.ADV_KIND, C.REF_EMBEDDING),
                        "sampled logprobs", "learned", True,
                        "stability of greedy completions under 11 proven prompt perturbations "
                        "(embedding similarity, relative perplexity) -> MLP")
    defaults = {"config": {}, "folds": 4}

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.config = ap.AdvPromptConfig.from_dict(self.params["config"])
        self.params["config"] = self.config.to_dict()
        self.model: ap.AdvPromptDetector | None = None
        self._oof: tuple[np.ndarray, np.ndarray, str] | None = None

    def fit(self, shadow: pa.Table, seed: int = 0) -> "AdvPromptMIA":
        self.seed = int(seed)
        self.model = ap.fit(self.arrays(shadow), self.config, self.seed)
        self._oof = None
        return self

    def arrays(self, table: pa.Table) -> dict[str, np.ndarray]:
        """The collection's AdvPrompt columns as the MLP's arrays (``advprompt.arrays_from_table``)."""
        return ap.arrays_from_table(table)

    def heldout(self, shadow: pa.Table) -> tuple[np.ndarray, np.ndarray, str]:
        if self._oof is None:
            oof = ap.cross_fit_log_odds(self.arrays(shadow), self.config, self.seed, int(self.params["folds"]))
            self._oof = (labels(shadow), oof, "shadow, out-of-fold (cross-fit by task)")
        return self._oof

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput(f"{self.spec.name}: fit (or load) the detector before scoring")
        return self.model.predict_log_odds(self.arrays(table))

    def _save_state(self, directory: Path) -> None:
        self.model.save(directory / "model")

    def _load_state(self, directory: Path) -> None:
        self.model = ap.AdvPromptDetector.load(directory / "model", device=self.config.device)
