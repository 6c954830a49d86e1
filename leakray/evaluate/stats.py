"""Statistics for comparing detectors across benchmarks, as the CGMIA paper does.

Small pure functions on numpy arrays; `x` is the reference detector's metric per benchmark,
`y` a baseline's on the same benchmarks (paired, same order, no missing values: callers drop
benchmarks where either is missing).

- `win_draw_loss`: counts of x beating / tying / losing to y; a draw is |x - y| <= tol.
- `paired_wilcoxon`: two-sided Wilcoxon signed-rank test on x - y (scipy.stats.wilcoxon with
  its defaults: zero differences dropped, exact distribution for small n without ties). Returns
  p = None with the reason when the test cannot say anything (fewer than 2 pairs, all
  differences zero), plus the smallest p the exact test could give with this many nonzero
  differences (2 / 2**n): with 4 benchmarks no difference can reach p < 0.125.
- `bh_adjust`: Benjamini–Hochberg adjusted p-values (scipy.stats.false_discovery_control,
  method 'bh') over the p-values that exist; None stays None and does not count in the family.
- `cliffs_delta`: P(x > y) - P(x < y) over all pairs (x_i, y_j), unpaired by definition.
- `magnitude`: Romano et al. (2006) labels for |delta|.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import false_discovery_control, wilcoxon

# Romano et al. (2006), "Appropriate statistics for ordinal level data": upper bounds of |delta|.
MAGNITUDE_BOUNDS = ((0.147, "negligible"), (0.33, "small"), (0.474, "medium"))
MIN_PAIRS = 2


def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired arrays must be 1-D and of equal length, got {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("paired arrays must be finite (drop missing benchmarks first)")
    return x, y


def win_draw_loss(x, y, tol: float = 0.005) -> tuple[int, int, int]:
    """(wins, draws, losses) of x against y; a draw is |x - y| <= tol."""
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    x, y = _paired(x, y)
    diff = x - y
    wins = int(np.sum(diff > tol))
    losses = int(np.sum(diff < -tol))
    return wins, len(diff) - wins - losses, losses


def paired_wilcoxon(x, y) -> dict:
    """Two-sided Wilcoxon signed-rank test of x - y.

    Keys: p (float or None), statistic (float or None), n (pairs), n_nonzero (pairs with a
    difference), min_attainable_p (the exact test's floor for n_nonzero, None when n_nonzero = 0),
    reason (why p is None, else None)."""
    x, y = _paired(x, y)
    diff = x - y
    n, n_nonzero = len(diff), int(np.count_nonzero(diff))
    out = {"p": None, "statistic": None, "n": n, "n_nonzero": n_nonzero,
           "min_attainable_p": min(1.0, 2.0 ** (1 - n_nonzero)) if n_nonzero else None, "reason": None}
    if n < MIN_PAIRS:
        out["reason"] = f"needs >= {MIN_PAIRS} paired benchmarks, has {n}"
    elif n_nonzero == 0:  # scipy returns NaN with a warning here; say why instead
        out["reason"] = "all paired differences are zero"
    else:
        res = wilcoxon(diff)
        out["p"], out["statistic"] = float(res.pvalue), float(res.statistic)
    return out


def bh_adjust(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg adjusted p-values, in input order; None entries stay None."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and np.isfinite(p)]
    out: list[float | None] = [None] * len(pvalues)
    if idx:
        adjusted = false_discovery_control(np.array([pvalues[i] for i in idx], dtype=float), method="bh")
        for i, q in zip(idx, adjusted):
            out[i] = float(q)
    return out


def cliffs_delta(x, y) -> float:
    """Cliff's delta: (#{x_i > y_j} - #{x_i < y_j}) / (len(x) * len(y)); in [-1, 1]."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("cliffs_delta needs non-empty arrays")
    return float(np.sign(x[:, None] - y[None, :]).mean())


def magnitude(delta: float) -> str:
    """negligible / small / medium / large for |delta| (Romano et al. 2006 thresholds)."""
    d = abs(delta)
    for bound, label in MAGNITUDE_BOUNDS:
        if d < bound:
            return label
    return "large"
