"""The card route's leaked fraction, made honest: rates measured off the rows that chose the cut,
exact bounds where a rate is 0 or 1, a transfer check before any number, and verdicts that agree
with the estimate.

A card's detector learnt its scale on the shadow. Its cut, its TPR/FPR and its calibration are
absolute values on that scale, so they mean something for a target only if the target's scores
are on it too: a target of another size, architecture or kind of leak moves raw losses, ranks and
generation quality. `transfer_check` asks the one question the card can answer without the truth:
is the target's score distribution a mixture of the card's own member and non-member
distributions? If no mixture weight fits (a Kolmogorov-Smirnov distance larger than a
parametric bootstrap from the fitted mixture allows), the card does not transfer and the route
prints no number.
"""

from __future__ import annotations

import numpy as np

from leakray.errors import BadInput
from leakray.evaluate.resample import drawn_whole


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact binomial interval for k successes in n (so 0/41 still allows a rate near 8.6%)."""
    from scipy.stats import beta

    if n <= 0:
        return 0.0, 1.0
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def youden(y, s) -> float:
    from sklearn.metrics import roc_curve

    fpr, tpr, cuts = roc_curve(np.asarray(y), np.asarray(s, np.float64))
    i = int(np.argmax(tpr - fpr))
    return float(cuts[i]) if np.isfinite(cuts[i]) else float(np.max(s)) + 1.0


def crossfit_rates(y, s, seed: int = 0) -> dict:
    """TPR/FPR of the Youden cut measured on rows that did not choose it: the held-out shadow rows
    split in two (stratified), a cut chosen on each half counted on the other; the counts pooled."""
    from sklearn.model_selection import StratifiedKFold

    y, s = np.asarray(y, np.int64), np.asarray(s, np.float64)
    if min(np.bincount(y, minlength=2)) < 2:
        raise BadInput("the card's held-out rows need at least 2 members and 2 non-members")
    tp = fp = 0
    for a, b in StratifiedKFold(2, shuffle=True, random_state=seed).split(s, y):
        cut = youden(y[a], s[a])
        tp += int(((s[b] >= cut) & (y[b] == 1)).sum())
        fp += int(((s[b] >= cut) & (y[b] == 0)).sum())
    n_pos, n_neg = int((y == 1).sum()), int((y == 0).sum())
    return {"cut": youden(y, s), "tp": tp, "n_pos": n_pos, "fp": fp, "n_neg": n_neg,
            "tpr": tp / n_pos, "fpr": fp / n_neg, "tpr_ci": clopper_pearson(tp, n_pos),
            "fpr_ci": clopper_pearson(fp, n_neg)}


def _mix_cdf(x, s0, s1, pi):
    f0 = np.searchsorted(np.sort(s0), x, side="right") / len(s0)
    f1 = np.searchsorted(np.sort(s1), x, side="right") / len(s1)
    return (1 - pi) * f0 + pi * f1


def _fit(t, s0, s1) -> tuple[float, float]:
    """(mixture weight, KS distance) of the best fit of the target's scores by the card's mixture."""
    grid = np.linspace(0, 1, 101)
    x = np.sort(t)
    emp_hi = np.arange(1, len(x) + 1) / len(x)
    emp_lo = np.arange(0, len(x)) / len(x)
    best = (0.0, np.inf)
    for pi in grid:
        m = _mix_cdf(x, s0, s1, pi)
        d = max(np.max(np.abs(emp_hi - m)), np.max(np.abs(emp_lo - m)))
        if d < best[1]:
            best = (float(pi), float(d))
    return best


def transfer_check(target, val_y, val_s, n_boot: int = 200, seed: int = 0, alpha: float = 0.01,
                   groups=None) -> dict:
    """Does the target's score distribution fit (1 - pi) F0 + pi F1 for some pi, F0/F1 the card's
    held-out non-member/member scores? A parametric bootstrap from the fitted mixture (with F0/F1
    themselves resampled, since they are estimated from few rows) gives the KS distance's null.
    ``groups``: one label per target score (`resample.group_index`); a near-copy group is one task
    read twice, so the null draws one score per group and gives it to each of the group's rows (the
    target's own copies score alike, and the KS distance of such a sample varies more)."""
    t = np.asarray(target, np.float64)
    fin = np.isfinite(t)
    t = t[fin]
    y, s = np.asarray(val_y, np.int64), np.asarray(val_s, np.float64)
    s0, s1 = s[y == 0], s[y == 1]
    pi, d = _fit(t, s0, s1)
    rng = np.random.default_rng(seed)
    rows_of = _group_rows(None if groups is None else np.asarray(groups)[fin])
    null = []
    for _ in range(int(n_boot)):
        b0, b1 = rng.choice(s0, len(s0)), rng.choice(s1, len(s1))
        if rows_of is None:  # every task alone: the draws as before groups existed
            n1 = rng.binomial(len(t), pi)
            sim = np.concatenate([rng.choice(b0, len(t) - n1), rng.choice(b1, n1)])
        else:  # a score per group, its member status drawn once, in a random order of the groups
            n1 = rng.binomial(len(rows_of), pi)
            one = np.concatenate([rng.choice(b0, len(rows_of) - n1), rng.choice(b1, n1)])[rng.permutation(len(rows_of))]
            sim = np.repeat(one, rows_of)
        null.append(_fit(sim, rng.choice(s0, len(s0)), rng.choice(s1, len(s1)))[1])
    p = float((1 + np.sum(np.asarray(null) >= d)) / (1 + len(null)))
    lo, hi = float(s.min()), float(s.max())
    span = hi - lo if hi > lo else 1.0
    outside = float(np.mean((t < lo - 0.1 * span) | (t > hi + 0.1 * span)))
    ok = p >= alpha and outside <= 0.05
    out = {"ok": bool(ok), "mixture_weight": pi, "ks": d, "p": p, "outside_range": outside,
           "target_median": float(np.median(t)), "card_nonmember_median": float(np.median(s0)),
           "card_member_median": float(np.median(s1))}
    if not ok:
        out["why"] = (f"the target's scores are not a mixture of the card's member and non-member scores "
                      f"(KS {d:.2f}, bootstrap p {p:.3f}; {outside:.0%} outside the card's range): the target "
                      f"is not on the shadow's scale")
    return out


def _group_rows(groups) -> np.ndarray | None:
    """Rows per group for labels with a group of two or more, else None (the task-by-task null)."""
    if groups is None or not drawn_whole(groups):
        return None
    return np.unique(groups, return_counts=True)[1]


def mixture_weight(t, s0, s1) -> float | None:
    """The share pi for which (1 - pi) F0 + pi F1 is nearest the target's empirical CDF, in least
    squares over the target's scores (the mixture's CDF is linear in pi, so pi has a closed form).
    It reads the whole distribution, not one cut: where members and non-members overlap (a faint
    leak), a count above a cut wastes most of what the scores say. None when F0 = F1 there."""
    x = np.sort(np.asarray(t, np.float64))
    emp = (np.arange(1, len(x) + 1) - 0.5) / len(x)
    f0 = np.searchsorted(np.sort(s0), x, side="right") / len(s0)
    f1 = np.searchsorted(np.sort(s1), x, side="right") / len(s1)
    d = f1 - f0
    if float(np.sum(d * d)) < 1e-12:
        return None
    return float(np.clip(np.sum((emp - f0) * d) / np.sum(d * d), 0.0, 1.0))


def shifted_mixture_weight(t, s0, s1, steps: int = 41) -> tuple[float, float] | None:
    """(pi, delta): the mixture weight when the card's two distributions may also sit ``delta`` off
    the target's (both moved together; delta on a grid of +-0.75 non-member sds). A shadow that read
    more members than the target spills over onto its non-members: measured on a pretraining-mixture
    card (82 members read 16 times), its non-members scored 0.09 (0.6 sd) above the target's. Not
    wider: far enough, "all members, moved down" passes for "no member" when F0 and F1 share a shape."""
    x = np.sort(np.asarray(t, np.float64))
    emp = (np.arange(1, len(x) + 1) - 0.5) / len(x)
    sd = float(np.std(s0)) or 1.0
    best = None
    for d in np.linspace(-0.75 * sd, 0.75 * sd, steps):
        pi = mixture_weight(x, s0 + d, s1 + d)
        if pi is None:
            continue
        f = (1 - pi) * np.searchsorted(np.sort(s0 + d), x, side="right") / len(s0) \
            + pi * np.searchsorted(np.sort(s1 + d), x, side="right") / len(s1)
        err = float(np.sum((emp - f) ** 2))
        if best is None or err < best[0]:
            best = (err, pi, float(d))
    return None if best is None else (best[1], best[2])


def mixture_estimate(target, y, s, n_boot: int = 200, seed: int = 0, groups=None) -> dict:
    """The leaked fraction as the target's mixture weight between the card's non-member (F0) and
    member (F1) score distributions, with a 95% bootstrap interval that resamples the target's tasks
    *and* the card's rows (F0 and F1 are estimated from few shadow tasks: their uncertainty is in
    the interval). Assumes what `transfer_check` tests: the target's scores are such a mixture.
    ``groups``: one label per target task (its near-copy group's, `resample.group_index`): a group
    is drawn whole."""
    from leakray.evaluate.resample import task_resamples

    t = np.asarray(target, np.float64)
    g = np.arange(len(t)) if groups is None else np.asarray(groups)
    t, g = t[np.isfinite(t)], g[np.isfinite(t)]
    y, s = np.asarray(y, np.int64), np.asarray(s, np.float64)
    s0, s1 = s[y == 0], s[y == 1]
    est = mixture_weight(t, s0, s1)
    if est is None:
        return {"estimate": None, "ci": [None, None], "why": "the card's member and non-member scores coincide"}
    rng = np.random.default_rng(seed)
    boots, shifted = [], []
    for _ in range(int(n_boot)):
        # the target's tasks (without groups: rng.choice's draws, as before), then the card's rows
        bt, b0, b1 = t[task_resamples(g, 1, rng)[0]], rng.choice(s0, len(s0)), rng.choice(s1, len(s1))
        boots.append(mixture_weight(bt, b0, b1))
        shifted.append(shifted_mixture_weight(bt, b0, b1, steps=21))
    boots = np.asarray([b for b in boots if b is not None])
    lo, hi = np.percentile(boots, [2.5, 97.5]).tolist() if len(boots) else (0.0, 1.0)
    # The interval also covers the fit that lets the target's scale sit off the card's: where the
    # target's own scores cannot tell "fewer members" from "the same members, lower scale", the
    # interval says so by its width instead of claiming the card's absolute scale holds.
    pi_shift, delta = shifted_mixture_weight(t, s0, s1) or (None, None)
    spi = np.asarray([b[0] for b in shifted if b is not None])
    s_lo, s_hi = np.percentile(spi, [2.5, 97.5]).tolist() if len(spi) else (0.0, 1.0)
    # the point estimate lets the location float too: at the card's scale it is the same number, off
    # it the fixed-scale weight is biased (a target 0.5 card sds lower read 12% for 23% members)
    point = est if pi_shift is None else pi_shift
    return {"estimate": point, "ci": [float(min(lo, s_lo, point)), float(max(hi, s_hi, point))],
            "fixed_scale": est, "fixed_scale_ci": [float(min(lo, est)), float(max(hi, est))],
            "shifted": {"estimate": pi_shift, "delta": delta, "ci": [float(s_lo), float(s_hi)]},
            "n_card_rows": [len(s0), len(s1)],
            "method": "least-squares mixture weight of the target's score CDF between the card's non-member "
                      "and member CDFs; bootstrap over target tasks and card rows; the interval also covers the "
                      "same fit with the card's scores shifted (a location the target's scores cannot pin)"}


def adjusted_interval(k: int, n: int, rates: dict) -> tuple[float, float, float]:
    """Forman's adjusted count (q - FPR) / (TPR - FPR) and a conservative 95% interval: the exact
    intervals of q, TPR and FPR combined at their worst corners."""
    q = k / n
    q_lo, q_hi = clopper_pearson(k, n)
    t_lo, t_hi = rates["tpr_ci"]
    f_lo, f_hi = rates["fpr_ci"]

    def acc(q_, t_, f_):
        return float(np.clip((q_ - f_) / (t_ - f_), 0, 1)) if t_ - f_ > 1e-9 else float(np.clip(q_, 0, 1))

    est = acc(q, rates["tpr"], rates["fpr"])
    lo = acc(q_lo, t_hi, f_hi)
    hi = acc(q_hi, max(t_lo, f_lo + 1e-6), f_lo)
    return est, min(lo, est), max(hi, est)


def posterior_flags(prob, train_prior: float, prevalence: float, fdr: float) -> tuple[np.ndarray, np.ndarray]:
    """(posterior, flagged): calibrated probabilities moved from the shadow's prior to the estimated
    prevalence (Saerens' prior shift), then the most probable members flagged while the expected
    share of non-members among the flagged (the Bayesian FDR) stays at most ``fdr``. At an
    estimate of 0 nothing is flagged: verdicts and the leaked fraction tell one story."""
    p = np.clip(np.asarray(prob, np.float64), 1e-6, 1 - 1e-6)
    w1, w0 = prevalence / train_prior, (1 - prevalence) / (1 - train_prior)
    post = w1 * p / (w1 * p + w0 * (1 - p))
    order = np.argsort(-post)
    running = np.cumsum(1 - post[order]) / np.arange(1, len(post) + 1)
    n_flag = int(np.max(np.flatnonzero(running <= fdr)) + 1) if (running <= fdr).any() else 0
    flags = np.zeros(len(post), bool)
    flags[order[:n_flag]] = True
    return post, flags
