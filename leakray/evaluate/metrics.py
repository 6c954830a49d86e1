"""Binary detection metrics: P/R/F1/MCC/accuracy, AUC, TPR at low FPR, bootstrap intervals, curves.

Conventions
- ``score``: higher = more likely a member; ``pred``: the detector's own 0/1 decision
  (thresholded metrics use ``pred``, ranking metrics use ``score``). Decisions come from
  thresholds chosen on the shadow collection (``leakray.evaluate.thresholds``).
- TPR at FPR = a, the conservative step: the largest TPR at an ROC vertex (one per
  distinct score, sklearn ``roc_curve(drop_intermediate=False)``) whose FPR <= a. No
  interpolation: with n_neg negatives the smallest nonzero FPR is 1/n_neg, and below it
  only vertices without a false positive count. ``n_neg`` and ``min_nonzero_fpr`` say so.
- MCC is 0 when a confusion-matrix margin is empty (as sklearn's ``matthews_corrcoef``),
  and ``degenerate`` is True then; precision is 0 with no predicted positives (sklearn's
  ``zero_division=0``). Both carry their reason in ``reasons``.
- Intervals: percentile bootstrap, resampling members and non-members separately (the
  class sizes stay fixed, as in the experiment), seeded: ``auc_ci`` and
  ``tpr_at_5fpr_ci`` as [lo, hi]. With ``groups`` (one label per row: a benchmark's near-copies
  share one, `resample.group_index`) a group is drawn whole (`resample.task_resamples`): a pair
  drawn as two independent tasks narrows the interval. Without a group of two, scipy's bootstrap
  as before.
- Keys: tp fp tn fn n n_pos n_neg min_nonzero_fpr accuracy precision recall f1 mcc
  degenerate auc pr_auc tpr_at_1fpr tpr_at_5fpr auc_ci tpr_at_5fpr_ci bootstrap roc_curve
  pr_curve reasons.
- Quantities that need both classes (AUC, TPR@FPR, recall with no members) are NaN with
  the reason in ``reasons``; nothing raises on a degenerate split.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
from scipy.stats import bootstrap, rankdata
from sklearn.metrics import (
    accuracy_score,
    confusion_matrix,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

from leakray.errors import BadInput
from leakray.evaluate.thresholds import mcc_from_counts

MAX_CURVE_POINTS = 101
FPR_TARGETS = (0.01, 0.05)
CI_FPR = 0.05  # the interval is given for TPR at this FPR
N_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
_FPR_SLACK = 1e-12  # k/n_neg against a when a*n_neg is an integer


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """Conservative step: the largest TPR at an ROC vertex with FPR <= target (no interpolation)."""
    fpr, tpr = np.asarray(fpr, float), np.asarray(tpr, float)
    ok = fpr <= target + _FPR_SLACK
    return float(tpr[ok].max()) if ok.any() else 0.0


def _auc_batched(pos: np.ndarray, neg: np.ndarray, axis: int = -1) -> np.ndarray:
    """ROC AUC (ties count half) per batch row, via the Mann-Whitney rank sum."""
    pos, neg = np.moveaxis(pos, axis, -1), np.moveaxis(neg, axis, -1)
    n_p, n_n = pos.shape[-1], neg.shape[-1]
    ranks = rankdata(np.concatenate([pos, neg], axis=-1), axis=-1)
    return (ranks[..., :n_p].sum(-1) - n_p * (n_p + 1) / 2) / (n_p * n_n)


def column_auc(y_true, x) -> np.ndarray:
    """ROC AUC of each column of ``x`` [n, m] as a score for the 0/1 labels ``y_true`` [n] (ties
    count half; a constant column reads 0.5): sklearn's ``roc_auc_score`` per column, up to
    float rounding, in one rank computation. The composites orient and screen tens of inputs on
    every fold of every seed; per column, sklearn's input checks took most of their fitting time."""
    y = np.asarray(y_true).astype(bool)
    x = np.asarray(x, dtype=np.float64).reshape(len(y), -1)
    if y.all() or not y.any():
        raise BadInput("column_auc needs both classes")
    return _auc_batched(x[y].T, x[~y].T)


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """The standard error of an AUC measured on ``n_pos`` positives and ``n_neg`` negatives (Hanley &
    McNeil, Radiology 1982, eq. 2, with their exponential approximations of Q1 and Q2)."""
    a = float(auc)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return float(np.sqrt(max(var, 0.0)))


def _tpr_at_fpr_batched(pos: np.ndarray, neg: np.ndarray, target: float, axis: int = -1) -> np.ndarray:
    """The conservative step TPR@FPR per batch row: at most k = floor(target*n_neg) false
    positives, so members must score above the (k+1)-th highest non-member."""
    pos, neg = np.moveaxis(pos, axis, -1), np.moveaxis(neg, axis, -1)
    n_n = neg.shape[-1]
    k = int(math.floor(target * n_n + 1e-9))
    if k >= n_n:
        return np.ones(pos.shape[:-1])
    cut = np.sort(neg, axis=-1)[..., n_n - 1 - k]
    return (pos > cut[..., None]).mean(-1)


def bootstrap_interval(statistic, pos: np.ndarray, neg: np.ndarray, n_resamples: int = N_BOOTSTRAP,
                       seed: int = BOOTSTRAP_SEED, confidence: float = CONFIDENCE,
                       groups: tuple[np.ndarray, np.ndarray] | None = None) -> list[float]:
    """Percentile bootstrap [lo, hi] of ``statistic(pos, neg, axis)``, members and non-members
    resampled separately (stratified by class), seeded. ``groups``: (members' group labels,
    non-members'), each group drawn whole (module doc)."""
    if groups is not None:
        from leakray.evaluate.resample import task_resamples

        rng = np.random.default_rng(seed)
        at_pos = task_resamples(groups[0], n_resamples, rng)
        at_neg = task_resamples(groups[1], n_resamples, rng)
        values = statistic(np.asarray(pos, float)[at_pos], np.asarray(neg, float)[at_neg], axis=-1)
        tail = (1 - confidence) / 2 * 100
        lo, hi = np.percentile(values, [tail, 100 - tail])
        return [float(lo), float(hi)]
    res = bootstrap((np.asarray(pos, float), np.asarray(neg, float)), statistic, n_resamples=n_resamples,
                    paired=False, vectorized=True, confidence_level=confidence, method="percentile",
                    rng=np.random.default_rng(seed))
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


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


def binary_metrics(y_true, score, pred, *, n_bootstrap: int = N_BOOTSTRAP, bootstrap_seed: int = BOOTSTRAP_SEED,
                   confidence: float = CONFIDENCE, groups=None) -> dict[str, Any]:
    """All metrics for one detector on one labelled split (see module doc for conventions).

    ``n_bootstrap=0`` skips the intervals (they are then NaN with a reason). ``groups``: one label
    per row, rows sharing one (near-copies) drawn together by the bootstrap.
    """
    y, s, p = _check(y_true, score, pred)
    if groups is not None and len(groups) != len(y):
        raise BadInput(f"groups has {len(groups)} rows, y_true {len(y)}", field="groups")
    grouped = groups is not None and len(set(groups)) < len(y)
    nan = float("nan")
    reasons: dict[str, str] = {}
    tn, fp, fn, tp = (int(v) for v in confusion_matrix(y, p, labels=[0, 1]).ravel())
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    out: dict[str, Any] = {
        "n": int(len(y)), "n_pos": n_pos, "n_neg": n_neg,
        "min_nonzero_fpr": 1.0 / n_neg if n_neg else nan,
        "tp": tp, "fp": fp, "tn": tn, "fn": fn,
        "accuracy": float(accuracy_score(y, p)),
    }
    out["precision"] = tp / (tp + fp) if tp + fp else 0.0
    if tp + fp == 0:
        reasons["precision"] = "no predicted positives (precision 0, as sklearn's zero_division=0)"
    out["recall"] = tp / (tp + fn) if tp + fn else nan
    if tp + fn == 0:
        reasons["recall"] = "no positive rows"
    pr, rc = out["precision"], out["recall"]
    out["f1"] = 2 * pr * rc / (pr + rc) if (pr + rc) > 0 else (0.0 if rc == rc else nan)
    out["degenerate"] = min(tp + fp, tp + fn, tn + fp, tn + fn) == 0
    out["mcc"] = float(mcc_from_counts(tp, fp, tn, fn))
    if out["degenerate"]:
        reasons["mcc"] = "a confusion-matrix margin is empty (one class in labels or predictions): MCC 0"

    ci_keys = ("auc_ci", f"tpr_at_{_pct(CI_FPR)}fpr_ci")
    out["bootstrap"] = {"n_resamples": int(n_bootstrap), "seed": int(bootstrap_seed), "confidence": confidence,
                        "method": "percentile, members and non-members resampled separately"
                                  + ("; near-copy groups drawn whole" if grouped else "")}
    if n_pos == 0 or n_neg == 0:
        why = f"one class only (n_pos={n_pos}, n_neg={n_neg})"
        for key in ("auc", "pr_auc", *(f"tpr_at_{_pct(a)}fpr" for a in FPR_TARGETS)):
            out[key] = nan
            reasons[key] = why
        for key in ci_keys:
            out[key] = [nan, nan]
            reasons[key] = why
        out["roc_curve"] = {"fpr": [], "tpr": [], "threshold": []}
        out["pr_curve"] = {"recall": [], "precision": [], "threshold": []}
    else:
        out["auc"] = float(roc_auc_score(y, s))
        fpr, tpr, thr = roc_curve(y, s, drop_intermediate=False)
        for a in FPR_TARGETS:
            out[f"tpr_at_{_pct(a)}fpr"] = tpr_at_fpr(fpr, tpr, a)
        if n_bootstrap > 0:
            pos, neg = s[y == 1], s[y == 0]
            # a group's rows in one class are drawn together (a group split across the classes is two)
            by = (np.asarray(groups)[y == 1], np.asarray(groups)[y == 0]) if grouped else None
            out[ci_keys[0]] = bootstrap_interval(_auc_batched, pos, neg, n_bootstrap, bootstrap_seed, confidence, by)
            out[ci_keys[1]] = bootstrap_interval(
                lambda a, b, axis=-1: _tpr_at_fpr_batched(a, b, CI_FPR, axis), pos, neg, n_bootstrap,
                bootstrap_seed, confidence, by)
        else:
            for key in ci_keys:
                out[key] = [nan, nan]
                reasons[key] = "bootstrap switched off (n_bootstrap=0)"
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


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def median_over_repeats(results: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Median of every numeric scalar field over ALL repeats (e.g. seeds), flat like one result.

    ``out[f]`` is the median, ``out[f + "_min"]`` / ``out[f + "_max"]`` the range,
    ``out["n_repeats"]`` the number of repeats. No repeat is left out: a field NaN in
    any repeat has a NaN median, and ``out["n_nan"][f]`` counts those repeats.
    ``out["n_degenerate"]`` counts repeats whose confusion matrix had an empty margin
    (their MCC is 0 and enters the median as 0). Intervals (``*_ci`` = [lo, hi]) become
    the median lo and median hi over repeats: the typical interval of one seed, not an
    interval for the median. Curves and other fields are skipped.
    """
    if not results:
        raise BadInput("no repeats to summarise")
    first = results[0]
    keys = [k for k, v in first.items() if _is_number(v)]
    ci_keys = [k for k, v in first.items() if k.endswith("_ci") and isinstance(v, (list, tuple)) and len(v) == 2]
    out: dict[str, Any] = {}
    n_nan: dict[str, int] = {}
    for key in keys:
        vals = np.array([float(r.get(key, np.nan)) for r in results])
        if np.isnan(vals).any():
            n_nan[key] = int(np.isnan(vals).sum())
        out[key] = float(np.median(vals))
        out[key + "_min"] = float(np.min(vals))
        out[key + "_max"] = float(np.max(vals))
    for key in ci_keys:
        bounds = np.array([[float(b) for b in r.get(key, (np.nan, np.nan))] for r in results])
        out[key] = [float(np.median(bounds[:, 0])), float(np.median(bounds[:, 1]))]
    out["n_repeats"] = len(results)
    out["n_degenerate"] = int(sum(bool(r.get("degenerate", False)) for r in results))
    out["n_nan"] = n_nan
    return out
