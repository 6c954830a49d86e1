"""Decision thresholds chosen on the shadow collection, never on the target.

A detector's 0/1 decision is ``score >= threshold``. The threshold is picked from the
shadow collection's labels and scores by a named rule, then applied unchanged to the
target, so the target's labels and member share never shape its decisions.

Rules
- ``shadow_max_mcc``: the cut with the highest MCC on the shadow rows (MCC 0 where a
  confusion margin is empty); among equal MCCs the highest cut (fewest positives).
- ``shadow_fpr:a`` (0 <= a <= 1): the cut with the largest shadow TPR among those whose
  shadow FPR <= a; among equal TPRs the highest cut. A cut above every score (nothing
  called a member) is allowed, so the FPR bound always holds on the shadow.

Cuts lie halfway between adjacent distinct shadow scores (any value in that gap gives
the same shadow decisions; the midpoint does not favour either neighbour on the target).
"Nothing is a member" is the next float above the top score, "everything" the lowest score.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from leakray.errors import BadInput

class ThresholdRule(str):
    """A rule parsed once, where it enters (the config, an API call): ``kind`` and ``fpr`` (None
    for ``shadow_max_mcc``). It stays its own text wherever it is written (config.json, reports,
    cards), and building one from a rule returns that rule unparsed."""

    kind: str
    fpr: float | None

    def __new__(cls, value: "str | ThresholdRule") -> "ThresholdRule":
        if isinstance(value, ThresholdRule):
            return value
        kind, fpr = _parse(str(value))
        rule = super().__new__(cls, value)
        rule.kind, rule.fpr = kind, fpr
        return rule


def _parse(rule: str) -> tuple[str, float | None]:
    if rule == "shadow_max_mcc":
        return rule, None
    name, _, arg = rule.partition(":")
    if name == "shadow_fpr":
        try:
            a = float(arg)
        except ValueError:
            a = float("nan")
        if 0.0 <= a <= 1.0:
            return name, a
        raise BadInput(f"threshold rule {rule!r}: the FPR bound must be a number in [0, 1], "
                       "e.g. shadow_fpr:0.05", field="threshold_rule")
    raise BadInput(f"unknown threshold rule {rule!r}; known: shadow_max_mcc, shadow_fpr:<a> (e.g. shadow_fpr:0.05)",
                   field="threshold_rule")


DEFAULT_RULE = ThresholdRule("shadow_max_mcc")


def parse_rule(rule: "str | ThresholdRule") -> tuple[str, float | None]:
    """``"shadow_max_mcc"`` -> ("shadow_max_mcc", None); ``"shadow_fpr:0.05"`` -> ("shadow_fpr", 0.05)."""
    rule = ThresholdRule(rule)
    return rule.kind, rule.fpr


@dataclass(frozen=True)
class Threshold:
    """A chosen cut and what it achieved on the rows it was chosen on."""

    rule: str
    value: float
    chosen_on: str  # which rows: e.g. "shadow" or "shadow, out-of-fold (4-fold cross-fit by task)"
    n_pos: int
    n_neg: int
    tpr: float  # on those rows
    fpr: float
    mcc: float

    def to_dict(self) -> dict:
        return asdict(self)


def mcc_from_counts(tp, fp, tn, fn) -> np.ndarray:
    """MCC per confusion matrix (arrays broadcast); 0 where a margin is empty, as sklearn does."""
    tp, fp, tn, fn = (np.asarray(v, dtype=np.float64) for v in (tp, fp, tn, fn))
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (tp * tn - fp * fn) / denom
    return np.where(denom > 0, out, 0.0)


def choose_threshold(y, score, rule: "str | ThresholdRule" = DEFAULT_RULE, chosen_on: str = "shadow") -> Threshold:
    """Pick the cut for ``score >= cut`` on labelled rows (the shadow) by ``rule``."""
    kind, alpha = parse_rule(rule)
    y = np.asarray(y)
    s = np.asarray(score, dtype=np.float64)
    if y.ndim != 1 or s.shape != y.shape or len(y) == 0:
        raise BadInput(f"labels and scores must be 1-D, equally long and non-empty: {y.shape}, {s.shape}")
    if not np.isin(y, (0, 1)).all():
        raise BadInput("threshold labels must be 0/1", row=int(np.flatnonzero(~np.isin(y, (0, 1)))[0]))
    if not np.isfinite(s).all():
        raise BadInput("non-finite score", row=int(np.flatnonzero(~np.isfinite(s))[0]), field="score")
    y = y.astype(int)
    n_pos, n_neg = int(y.sum()), int(len(y) - y.sum())
    if n_pos == 0 or n_neg == 0:
        raise BadInput(f"cannot choose a threshold on one class (n_pos={n_pos}, n_neg={n_neg})")

    # Candidate i predicts the rows whose score is among the i highest distinct values
    # (i = 0: nothing). Counts are cumulative over distinct values, highest first.
    values, inverse = np.unique(-s, return_inverse=True)  # ascending -s = descending s
    values = -values
    tp = np.concatenate([[0], np.cumsum(np.bincount(inverse, weights=y, minlength=len(values)))])
    fp = np.concatenate([[0], np.cumsum(np.bincount(inverse, weights=1 - y, minlength=len(values)))])
    tpr, fpr = tp / n_pos, fp / n_neg
    mcc = mcc_from_counts(tp, fp, n_neg - fp, n_pos - tp)
    if kind == "shadow_max_mcc":
        i = int(np.argmax(mcc))  # first maximum = highest cut
    else:
        ok = fpr <= alpha + 1e-12  # FP/n_neg against a, with float slack for a*n_neg integral
        best = tpr[ok].max()
        i = int(np.flatnonzero(ok & (tpr == best))[0])
    if i == 0:
        cut = float(np.nextafter(values[0], np.inf))
    elif i == len(values):
        cut = float(values[-1])
    else:
        cut = float((values[i - 1] + values[i]) / 2)
        if not values[i] < cut <= values[i - 1]:  # adjacent floats: the midpoint rounds onto one
            cut = float(values[i - 1])
    return Threshold(rule=rule, value=cut, chosen_on=chosen_on, n_pos=n_pos, n_neg=n_neg,
                     tpr=float(tpr[i]), fpr=float(fpr[i]), mcc=float(mcc[i]))


def apply_threshold(score, threshold: float | Threshold) -> np.ndarray:
    """0/1 decisions (int8): 1 where score >= threshold."""
    cut = threshold.value if isinstance(threshold, Threshold) else float(threshold)
    return (np.asarray(score, dtype=np.float64) >= cut).astype(np.int8)
