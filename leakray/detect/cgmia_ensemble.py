"""CGMIA ensemble (the CGMIA paper's RQ4): several CGMIA detectors, each weighted by its MCC
on held-out shadow data.

The paper ensembles detectors trained on different shadow models. A run has one shadow
collection, so the members here are CGMIA fitted on that shadow with different seeds
(different frozen projections, initialisations and batch orders); the report says so
(``info["members_from"]``). The ensemble of seed s has CGMIA's seeds s, s+1, ..., s+m-1 as
members, so run beside CGMIA it costs no fit of its own (``CGMIA.fit_group``: 5 seeds of both
fit 7 CGMIA seeds, not 5 + 15); its seeds' member sets overlap, so its repeats vary less
than independent ensembles would. Member m's weight is max(MCC_m, 0), MCC_m measured at its own
cut on its out-of-fold shadow scores (4-fold cross-fit by task, as CGMIA's
threshold); all weights 0 falls back to equal weights. The ensemble's score is the
weighted mean of the members' probabilities (each the float64 logistic of the member's
log-odds: CGMIA scores by log-odds, the paper's ensemble averages probabilities), and its
threshold is chosen on the same weighted mean of their out-of-fold probabilities.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, FitContext, KeepsHeldout, labels
from leakray.detect.cgmia import CGMIA, CROSS_FIT_FOLDS, CGMIAConfig, CGMIADetector, arrays_from_table, fit_thresholded
from leakray.detect.datafiles import load_array
from leakray.errors import BadInput
from leakray.evaluate.thresholds import choose_threshold
from leakray.schema import C


class CGMIAEnsemble(KeepsHeldout):
    spec = DetectorSpec("cgmia_ensemble", "the CGMIA paper, RQ4 (ensemble of shadows)",
                        (C.EXPERT, C.GEN_EMBEDDING, C.REF_EMBEDDING), "sampled logprobs", "composite", True,
                        "MCC-weighted mean of CGMIA members' probabilities (members: seeds of one shadow)")
    defaults = {"members": 3, "config": {}, "folds": CROSS_FIT_FOLDS}
    group = CGMIA.group  # made of CGMIA fits: fitted together with CGMIA (CGMIA.fit_group)

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.config = CGMIAConfig.from_dict(self.params["config"])
        self.params["config"] = self.config.to_dict()
        if int(self.params["members"]) < 2:
            raise BadInput("cgmia_ensemble: members must be >= 2", field="detect.params.cgmia_ensemble.members")
        self.models: list[CGMIADetector] = []
        self.weights = np.zeros(0)

    @classmethod
    def fit_group(cls, names: list[str], shadow: pa.Table, seeds: Iterable[int],
                  params: Mapping[str, Mapping[str, Any]], context: FitContext | None = None) -> dict[str, list]:
        return CGMIA.fit_group(names, shadow, seeds, params, context)

    @classmethod
    def cgmia_fits(cls, params: Mapping[str, Any], seed: int) -> list[int]:
        return [int(seed) + i for i in range(int(params["members"]))]

    @classmethod
    def from_cgmia_fits(cls, models: list[CGMIADetector], shadow: pa.Table, seed: int,
                        params: Mapping[str, Any]) -> "CGMIAEnsemble":
        det = cls(**params)
        det._combine(models, labels(shadow), int(seed))
        return det

    def fit(self, shadow: pa.Table, seed: int = 0) -> "CGMIAEnsemble":
        arrays, y = arrays_from_table(shadow), labels(shadow)
        folds = int(self.params["folds"])
        self._combine([fit_thresholded(arrays, self.config, ms, n_folds=folds)
                       for ms in self.cgmia_fits(self.params, seed)], y, int(seed))
        return self

    def _combine(self, models: list[CGMIADetector], y: np.ndarray, seed: int) -> None:
        """Weights from the members' out-of-fold scores (log-odds, kept by ``fit_thresholded``)."""
        self.seed, self.models = seed, list(models)
        from scipy.special import expit

        oofs = [expit(m.oof) for m in self.models]  # probabilities, as the members' scores below
        mccs = [choose_threshold(y, oof).mcc for oof in oofs]  # MCC at the member's own max-MCC cut
        w = np.clip(np.asarray(mccs), 0.0, None)
        self.weights = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
        chosen_on = self.models[0].threshold["chosen_on"]  # "shadow, out-of-fold (k-fold cross-fit by task)"
        self._heldout = (y, np.average(np.stack(oofs), axis=0, weights=self.weights),
                         f"{chosen_on}, weighted like the members")
        self.info = {"members_from": "one shadow collection, different seeds (no second shadow configured)",
                     "member_seeds": [m.seed for m in self.models], "member_heldout_mcc": [float(m) for m in mccs],
                     "weights": self.weights.tolist()}

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
