"""Scores -> membership probabilities, calibrated on held-out shadow data (scikit-learn).

A detector's score ranks; a maintainer needs a probability. The calibrator is fitted on
shadow rows no detector trained on, and its quality (Brier score, reliability curve) is
measured by cross-fitting on those rows, so the report never grades a calibrator on the
rows it was fitted to. It is saved as plain numbers (JSON) inside a detector card.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from leakray.errors import BadInput

METHODS = ("isotonic", "platt")


@dataclass
class Calibrator:
    method: str
    params: dict = field(default_factory=dict)

    def predict(self, score) -> np.ndarray:
        s = np.asarray(score, dtype=np.float64)
        if self.method == "isotonic":
            return np.interp(s, self.params["x"], self.params["y"])  # clipped at both ends, as fitted
        z = self.params["coef"] * s + self.params["intercept"]
        return 1.0 / (1.0 + np.exp(-z))

    def to_dict(self) -> dict:
        return {"method": self.method, "params": self.params}

    @classmethod
    def from_dict(cls, d: dict) -> "Calibrator":
        if d.get("method") not in METHODS:
            raise BadInput(f"unknown calibration method {d.get('method')!r}; known: {', '.join(METHODS)}")
        return cls(d["method"], dict(d["params"]))


def _check(y, s) -> tuple[np.ndarray, np.ndarray]:
    y, s = np.asarray(y, dtype=np.int64), np.asarray(s, dtype=np.float64)
    if y.shape != s.shape or y.ndim != 1 or not len(y):
        raise BadInput(f"calibration needs equally long 1-D labels and scores, got {y.shape} and {s.shape}")
    if not np.isfinite(s).all():
        raise BadInput("calibration: non-finite score", row=int(np.flatnonzero(~np.isfinite(s))[0]))
    if len(np.unique(y)) < 2:
        raise BadInput("calibration needs members and non-members among the held-out shadow rows")
    return y, s


def fit_calibrator(y, score, method: str = "isotonic") -> Calibrator:
    y, s = _check(y, score)
    if method == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(s, y)
        return Calibrator(method, {"x": iso.X_thresholds_.tolist(), "y": iso.y_thresholds_.tolist()})
    if method == "platt":
        from sklearn.linear_model import LogisticRegression

        lr = LogisticRegression(C=1e6).fit(s[:, None], y)  # Platt: a 1-D logistic fit, barely regularised
        return Calibrator(method, {"coef": float(lr.coef_[0, 0]), "intercept": float(lr.intercept_[0])})
    raise BadInput(f"unknown calibration method {method!r}; known: {', '.join(METHODS)}", field="audit.calibration")


def crossfit_probabilities(y, score, method: str = "isotonic", folds: int = 5, seed: int = 0) -> np.ndarray:
    """Out-of-fold calibrated probabilities: each row's from a calibrator fitted without it."""
    from sklearn.model_selection import StratifiedKFold

    y, s = _check(y, score)
    folds = max(2, min(folds, int(np.bincount(y).min())))
    out = np.empty(len(y))
    for tr, te in StratifiedKFold(folds, shuffle=True, random_state=seed).split(s, y):
        if len(np.unique(y[tr])) < 2:
            out[te] = y[tr].mean()
            continue
        out[te] = fit_calibrator(y[tr], s[tr], method).predict(s[te])
    return out


def reliability(y, prob, bins: int = 10) -> dict:
    """Mean predicted probability vs observed member share per quantile bin, with counts."""
    from sklearn.calibration import calibration_curve

    y, p = np.asarray(y, dtype=np.int64), np.clip(np.asarray(prob, dtype=np.float64), 0.0, 1.0)
    frac, mean = calibration_curve(y, p, n_bins=bins, strategy="uniform")
    edges = np.linspace(0.0, 1.0, bins + 1)
    # binned as calibration_curve bins (a probability on an edge goes to the bin below it): an
    # isotonic calibrator's steps often land exactly on 0.1, 0.2, ..., and `np.digitize` put them in
    # the bin above, so a bin could hold counts and no curve point (the page's plot then failed)
    counts = np.bincount(np.searchsorted(edges[1:-1], p), minlength=bins)
    return {"mean_predicted": mean.tolist(), "fraction_positive": frac.tolist(),
            "count": [int(c) for c in counts if c > 0]}


def brier(y, prob) -> float:
    from sklearn.metrics import brier_score_loss

    return float(brier_score_loss(np.asarray(y, dtype=np.int64), np.clip(np.asarray(prob, dtype=np.float64), 0, 1)))


def calibration_report(y, score, method: str = "isotonic", seed: int = 0) -> dict:
    """Cross-fitted quality of ``method`` on held-out rows, beside the uncalibrated baseline
    (the base rate for every row, whose Brier score any useful calibrator must beat)."""
    y, s = _check(y, score)
    p = crossfit_probabilities(y, s, method, seed=seed)
    return {"method": method, "brier": round(brier(y, p), 4),
            "brier_base_rate": round(brier(y, np.full(len(y), y.mean())), 4),
            "reliability": reliability(y, p), "n": int(len(y)), "chosen_on": "shadow validation rows, 5-fold cross-fit"}
