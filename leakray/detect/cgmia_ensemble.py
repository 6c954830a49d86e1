"""CGMIA ensemble (the CGMIA paper's RQ4): several CGMIA detectors, each weighted by its MCC
on held-out shadow data.

The paper ensembles detectors trained on different shadow models. A run has one shadow
collection, so the members here are CGMIA fitted on that shadow with different seeds
(different frozen projections, initialisations and batch orders); the report says so
(``info["members_from"]``). Member m's weight is max(MCC_m, 0), MCC_m measured at its own
cut on its out-of-fold shadow probabilities (4-fold cross-fit by task, as CGMIA's
threshold); all weights 0 falls back to equal weights. The ensemble's score is the
weighted mean of the members' probabilities, and its threshold is chosen on the same
weighted mean of their out-of-fold probabilities.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, KeepsHeldout, labels
from leakray.detect.cgmia import CROSS_FIT_FOLDS, CGMIAConfig, CGMIADetector, arrays_from_table, cross_fit_proba, fit
from leakray.detect.datafiles import load_array
from leakray.errors import BadInput
from leakray.evaluate.thresholds import choose_threshold
from leakray.schema import C


class CGMIAEnsemble(KeepsHeldout):
    spec = DetectorSpec("cgmia_ensemble", "the CGMIA paper, RQ4 (ensemble of shadows)",
                        (C.EXPERT, C.GEN_EMBEDDING, C.REF_EMBEDDING), "logprobs", "composite", True,
                        "MCC-weighted mean of CGMIA members' probabilities (members: seeds of one shadow)")
    defaults = {"members": 3, "config": {}, "folds": CROSS_FIT_FOLDS}

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.config = CGMIAConfig.from_dict(self.params["config"])
        self.params["config"] = self.config.to_dict()
        if int(self.params["members"]) < 2:
            raise BadInput("cgmia_ensemble: members must be >= 2", field="detect.params.cgmia_ensemble.members")
        self.models: list[CGMIADetector] = []
        self.weights = np.zeros(0)

    def fit(self, shadow: pa.Table, seed: int = 0) -> "CGMIAEnsemble":
        self.seed = int(seed)
        arrays, y = arrays_from_table(shadow), labels(shadow)
        folds = min(int(self.params["folds"]), int((y == 0).sum()), int((y == 1).sum()))
        member_seeds = [int(v) for v in np.random.SeedSequence([self.seed, 23]).generate_state(
            int(self.params["members"]))]
        self.models, oofs, mccs = [], [], []
        for ms in member_seeds:
            self.models.append(fit(arrays, self.config, ms, progress=False))
            oof = cross_fit_proba(arrays, self.config, ms, folds)
            oofs.append(oof)
            mccs.append(choose_threshold(y, oof).mcc)  # MCC at the member's own max-MCC cut
        w = np.clip(np.asarray(mccs), 0.0, None)
        self.weights = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
        self._heldout = (y, np.average(np.stack(oofs), axis=0, weights=self.weights),
                         f"shadow, out-of-fold ({folds}-fold cross-fit by task), weighted like the members")
        self.info = {"members_from": "one shadow collection, different seeds (no second shadow configured)",
                     "member_seeds": member_seeds, "member_heldout_mcc": [float(m) for m in mccs],
                     "weights": self.weights.tolist()}
        return self

    def score(self, table: pa.Table) -> np.ndarray:
        if not self.models:
            raise BadInput("cgmia_ensemble: fit (or load) the detector before scoring")
        arrays = arrays_from_table(table)
        return np.average(np.stack([m.predict_proba(arrays) for m in self.models]), axis=0, weights=self.weights)

    def _save_state(self, directory: Path) -> None:
        for i, m in enumerate(self.models):
            m.save(directory / f"member{i}")
        np.save(directory / "weights.npy", self.weights)

    def _load_state(self, directory: Path) -> None:
        self.weights = load_array(directory / "weights.npy")
        self.models = [CGMIADetector.load(directory / f"member{i}") for i in range(len(self.weights))]
