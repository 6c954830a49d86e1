"""Binary detection metrics: P/R/F1/MCC/accuracy, AUC, TPR at low FPR, ROC/PR curves.

Conventions
- ``score``: higher = more likely a member; ``pred``: the detector's own 0/1 decision
  (thresholded metrics use ``pred``, ranking metrics use ``score``).
- TPR at FPR = a: read off the ROC polyline through every distinct threshold
  (sklearn ``roc_curve`` with ``drop_intermediate=False``). Take the last vertex with
  FPR <= a; if its FPR is exactly a, report its TPR (the top of a vertical segment),
  otherwise interpolate linearly towards the next vertex. The straight segment is the
  randomised classifier between two thresholds (and the "random tie-break" reading of
  tied scores), so the value is achievable, never optimistic. With few negatives
  (a < 1/n_neg) it is an interpolation between FPR 0 and the first false positive.
- Keys: tp fp tn fn n n_pos n_neg accuracy precision recall f1 mcc auc pr_auc
  tpr_at_1fpr tpr_at_5fpr (TPR at 1% / 5% FPR) roc_curve pr_curve reasons.
- Undefined quantities are NaN with the reason in ``reasons`` (one class only, no
  predicted positives); nothing raises on a degenerate split.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
from sklearn.metrics import (
    accuracy_score,
    confusion_matrix,
    matthews_corrcoef,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

from leakray.errors import BadInput

MAX_CURVE_POINTS = 101
FPR_TARGETS = (0.01, 0.05)


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """TPR at FPR=target on an ROC polyline (vertices sorted by decreasing threshold)."""
    fpr, tpr = np.asarray(fpr, float), np.asarray(tpr, float)
    i = int(np.searchsorted(fpr, target, side="right")) - 1  # last vertex with fpr <= target
    if i < 0:
        return 0.0
    if fpr[i] == target or i == len(fpr) - 1:
        return float(tpr[i])
    f0, f1, t0, t1 = fpr[i], fpr[i + 1], tpr[i], tpr[i + 1]
    return float(t0 + (t1 - t0) * (target - f0) / (f1 - f0))


def downsample(points: Iterable[np.ndarray], max_points: int = MAX_CURVE_POINTS) -> list[list[float]]:
    """Keep <= max_points evenly spaced vertices of parallel arrays, endpoints included."""
    arrays = [np.asarray(a, float) for a in points]
    n = len(arrays[0])
    idx = np.unique(np.round(np.linspace(0, n - 1, min(n, max_points))).astype(int)) if n else []
    return [a[idx].tolist() for a in arrays]


def _check(y_true, score, pred) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = np.asarray(y_true)
    s = np.asarray(score, dtype=float)
    p = np.asarray(pred)
    if not (y.ndim == s.ndim == p.ndim == 1) or not (len(y) == len(s) == len(p)):
        raise BadInput(f"y_true, score, pred must be 1-D and equally long: {y.shape}, {s.shape}, {p.shape}")
    if len(y) == 0:
        raise BadInput("no rows to evaluate")
    for name, a in (("y_true", y), ("pred", p)):
        bad = ~np.isin(a, (0, 1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BadInput(f"{name} must be 0/1, got {a[i]!r}", row=i, field=name)
    if not np.all(np.isfinite(s)):
        i = int(np.flatnonzero(~np.isfinite(s))[0])
        raise BadInput(f"non-finite score {s[i]}", row=i, field="score")
    return y.astype(int), s, p.astype(int)


def binary_metrics(y_true, score, pred) -> dict[str, Any]:
    """All metrics for one detector on one labelled split (see module doc for conventions)."""
    y, s, p = _check(y_true, score, pred)
    nan = float("nan")
    reasons: dict[str, str] = {}
    tn, fp, fn, tp = (int(v) for v in confusion_matrix(y, p, labels=[0, 1]).ravel())
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    out: dict[str, Any] = {
        "n": int(len(y)), "n_pos": n_pos, "n_neg": n_neg,
        "tp": tp, "fp": fp, "tn": tn, "fn": fn,
        "accuracy": float(accuracy_score(y, p)),
    }
    out["precision"] = tp / (tp + fp) if tp + fp else nan
    if tp + fp == 0:
        reasons["precision"] = "no predicted positives"
    out["recall"] = tp / (tp + fn) if tp + fn else nan
    if tp + fn == 0:
        reasons["recall"] = "no positive rows"
    pr, rc = out["precision"], out["recall"]
    out["f1"] = 2 * pr * rc / (pr + rc) if (pr + rc) > 0 else (0.0 if pr == pr and rc == rc else nan)
    # MCC is undefined when any confusion margin is empty; sklearn says 0 there, we say NaN.
    if min(tp + fp, tp + fn, tn + fp, tn + fn) == 0:
        out["mcc"] = nan
        reasons["mcc"] = "a confusion-matrix margin is empty (one class in labels or predictions)"
    else:
        out["mcc"] = float(matthews_corrcoef(y, p))

    if n_pos == 0 or n_neg == 0:
        why = f"one class only (n_pos={n_pos}, n_neg={n_neg})"
        for key in ("auc", "pr_auc", *(f"tpr_at_{_pct(a)}fpr" for a in FPR_TARGETS)):
            out[key] = nan
            reasons[key] = why
        out["roc_curve"] = {"fpr": [], "tpr": [], "threshold": []}
        out["pr_curve"] = {"recall": [], "precision": [], "threshold": []}
    else:
        out["auc"] = float(roc_auc_score(y, s))
        fpr, tpr, thr = roc_curve(y, s, drop_intermediate=False)
        for a in FPR_TARGETS:
            out[f"tpr_at_{_pct(a)}fpr"] = tpr_at_fpr(fpr, tpr, a)
        prec, rec, pthr = precision_recall_curve(y, s)
        # step-wise average precision over the curve (sklearn's PR-AUC convention)
        out["pr_auc"] = float(-np.sum(np.diff(rec) * prec[:-1]))
        thr = np.where(np.isfinite(thr), thr, np.nan)  # sklearn's first threshold is +inf
        f, t, h = downsample((fpr, tpr, thr))
        out["roc_curve"] = {"fpr": f, "tpr": t, "threshold": [None if math.isnan(v) else v for v in h]}
        # precision_recall_curve has one threshold fewer than points; pad the last (recall 0)
        r, pp, ph = downsample((rec, prec, np.append(pthr, np.nan)))
        out["pr_curve"] = {"recall": r, "precision": pp, "threshold": [None if math.isnan(v) else v for v in ph]}
    out["reasons"] = reasons
    return out


def _pct(a: float) -> str:
    return f"{a * 100:g}"  # tpr_at_1fpr = TPR at 1% FPR, tpr_at_5fpr = TPR at 5% FPR


def median_over_repeats(results: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Median of every numeric scalar field over repeats (e.g. seeds), flat like one result.

    ``out[f]`` is the median, ``out[f + "_min"]`` / ``out[f + "_max"]`` the range,
    ``out["n_repeats"]`` the number of repeats. NaN repeats are left out of the
    statistics and counted in ``out["n_nan"][f]``; a field NaN in every repeat stays NaN.
    Curves and non-numeric fields are skipped.
    """
    if not results:
        raise BadInput("no repeats to summarise")
    keys = [k for k, v in results[0].items()
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)]
    out: dict[str, Any] = {}
    n_nan: dict[str, int] = {}
    for key in keys:
        vals = np.array([float(r.get(key, np.nan)) for r in results])
        ok = vals[~np.isnan(vals)]
        if len(ok) < len(vals):
            n_nan[key] = int(len(vals) - len(ok))
        out[key] = float(np.median(ok)) if len(ok) else float("nan")
        out[key + "_min"] = float(ok.min()) if len(ok) else float("nan")
        out[key + "_max"] = float(ok.max()) if len(ok) else float("nan")
    out["n_repeats"] = len(results)
    out["n_nan"] = n_nan
    return out
