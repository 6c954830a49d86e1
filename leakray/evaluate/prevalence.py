"""How much of a benchmark leaked: the member share among the target's samples.

Counting the samples a detector flags (classify and count) is biased whenever the
detector errs and the prevalence is unknown: with FPR 0.1, a clean benchmark "leaks" 10%.
Two corrections, both from the quantification literature, both using only shadow data:

- adjusted classify-and-count (Forman 2008): p = (q - FPR) / (TPR - FPR), with TPR and
  FPR of the cut measured on held-out shadow rows and the cut where TPR - FPR is largest
  (where the correction is best conditioned);
- EM prior shift (Saerens et al. 2002): re-weight the calibrated posteriors to the prior
  that makes their mean consistent.

The 95% interval resamples both the target's samples and the shadow rows the rates were
measured on, so it carries the uncertainty of TPR and FPR as well as of q.
"""

from __future__ import annotations

import numpy as np

from leakray.errors import BadInput

METHODS = ("acc", "em")


def youden_cut(y, score) -> dict:
    """The cut maximising TPR - FPR on labelled rows, with its rates."""
    from sklearn.metrics import roc_curve

    fpr, tpr, cuts = roc_curve(np.asarray(y), np.asarray(score, dtype=np.float64))
    i = int(np.argmax(tpr - fpr))
    cut = float(cuts[i]) if np.isfinite(cuts[i]) else float(np.max(score)) + 1.0
    return {"cut": cut, "tpr": float(tpr[i]), "fpr": float(fpr[i])}


def rates(y, score, cut: float) -> tuple[float, float]:
    y, flag = np.asarray(y), np.asarray(score, dtype=np.float64) >= cut
    return float(flag[y == 1].mean()), float(flag[y == 0].mean())


def adjusted_count(q: float, tpr: float, fpr: float) -> float:
    """Forman's adjusted classify-and-count, clipped to [0, 1]; q itself when the detector
    cannot tell members apart (TPR <= FPR), which the caller reports as unusable."""
    if tpr - fpr <= 1e-9:
        return float(np.clip(q, 0.0, 1.0))
    return float(np.clip((q - fpr) / (tpr - fpr), 0.0, 1.0))


def em_prior(posteriors, train_prior: float, tol: float = 1e-6, max_iter: int = 1000) -> float:
    """Saerens-Latinne-Decaestecker EM: the target prior under which the re-weighted
    posteriors average to it. ``posteriors`` are calibrated for ``train_prior``."""
    p = np.clip(np.asarray(posteriors, dtype=np.float64), 1e-6, 1 - 1e-6)
    if not 0.0 < train_prior < 1.0:
        raise BadInput(f"EM needs a training prior in (0, 1), got {train_prior}")
    prior = train_prior
    for _ in range(max_iter):
        w1, w0 = prior / train_prior, (1 - prior) / (1 - train_prior)
        new = float(np.mean(w1 * p / (w1 * p + w0 * (1 - p))))
        if abs(new - prior) < tol:
            return new
        prior = new
    return prior


def estimate_prevalence(target_score, val_y, val_score, calibrate=None, *, method: str = "acc",
                        n_boot: int = 1000, seed: int = 0) -> dict:
    """Point estimates (classify-and-count, adjusted count, EM when ``calibrate`` is given)
    and the chosen method's bootstrap 95% interval.

    ``calibrate(scores) -> probabilities`` is the calibrator fitted on (val_y, val_score);
    within the bootstrap it is kept fixed (refitting an isotonic map on each resample would
    mostly add its own noise)."""
    if method not in METHODS:
        raise BadInput(f"unknown prevalence method {method!r}; known: {', '.join(METHODS)}",
                       field="audit.prevalence_method")
    if method == "em" and calibrate is None:
        raise BadInput("the EM estimate needs a calibrator")
    t = np.asarray(target_score, dtype=np.float64)
    vy, vs = np.asarray(val_y, dtype=np.int64), np.asarray(val_score, dtype=np.float64)
    if not len(t):
        raise BadInput("no target samples to estimate prevalence on")
    cut = youden_cut(vy, vs)
    q = float((t >= cut["cut"]).mean())
    train_prior = float(vy.mean())

    def point(ts, ys, ss) -> dict:
        tpr, fpr = rates(ys, ss, cut["cut"])
        out = {"classify_and_count": float((ts >= cut["cut"]).mean()),
               "acc": adjusted_count(float((ts >= cut["cut"]).mean()), tpr, fpr)}
        if calibrate is not None:
            out["em"] = em_prior(calibrate(ts), float(ys.mean()))
        return out

    est = point(t, vy, vs)
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(vy == 1), np.flatnonzero(vy == 0)
    boots = []
    for _ in range(int(n_boot)):
        ti = rng.integers(0, len(t), len(t))
        vi = np.concatenate([rng.choice(pos, len(pos)), rng.choice(neg, len(neg))])  # stratified: both classes
        boots.append(point(t[ti], vy[vi], vs[vi])[method])
    lo, hi = (np.percentile(boots, [2.5, 97.5]).tolist() if boots else [None, None])
    usable = cut["tpr"] - cut["fpr"] > 0.05
    return {
        "estimate": est[method], "ci": [lo, hi], "method": method,
        "classify_and_count": est["classify_and_count"], "acc": est["acc"], "em": est.get("em"),
        "cut": cut["cut"], "tpr": cut["tpr"], "fpr": cut["fpr"], "q": q, "train_prior": train_prior,
        "n_target": int(len(t)), "n_val": int(len(vy)), "n_boot": int(n_boot), "seed": int(seed),
        "usable": bool(usable),
        **({} if usable else {"why_unusable": "the detector barely separates shadow members (TPR - FPR <= 0.05): "
                                              "the estimate is the raw flagged share"}),
    }
