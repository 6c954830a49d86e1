"""The self-calibrated audit route: a per-task test whose null comes from the target itself.

For task i the model under audit (T) and a reference model (R, not the target's own checkpoint)
score the original solution x0 and n rewrites x1..xn that rename its locals
(`leakray.perturb.rewrite`). The statistic of each text is the log-likelihood ratio
d_j = log p_T(x_j) - log p_R(x_j): how much more the target likes the text than the reference does.
A model that never read the task has no reason to like the original's spelling more, relative to
the reference, than a rewrite's; one that read it does. So

    t_i = (d_0 - mean(d_1..n)) / (sd(d_1..n) * sqrt(1 + 1/n))

is, under "not seen" (H0), a draw of the same kind as the rewrites' own, and its one-sided p-value
comes from Student's t with n - 1 degrees of freedom (the prediction interval of a new draw).

Assumptions, each checked rather than trusted:
- H0 exchangeability (the original is, for a clean target relative to the reference, just another
  rewrite). Violated when the target prefers natural spelling more than the reference does (a
  stronger model). Checked where it can be: the p-values above `lam` come from non-members only and
  must be uniform there (`null_check`); the report prints the test and refuses the number when it
  fails. `calibrate_null` can move the null to the one measured on a clean model (the card's shadow
  base) when the user has one.
- The d_j are roughly normal (sums of many token log-probabilities): the t prediction p-value.

From the p-values: Storey's pi0 (the share of tasks consistent with H0) and the leaked fraction
1 - pi0 with a bootstrap interval over tasks; per-task q-values (Storey's FDR), so "suspected"
controls the expected share of false leaks among the tasks flagged.
"""

from __future__ import annotations

import numpy as np

from leakray.errors import BadInput
from leakray.schema import R


def task_statistics(table) -> dict:
    """Per task: t statistic, p-value and why a task has none. ``table``: rewrite scores (schema R)."""
    from scipy import stats

    rows = table.to_pylist() if hasattr(table, "to_pylist") else list(table)
    ids, t_stat, p, why, dfs = [], [], [], [], []
    for r in rows:
        ids.append(r[R.TASK_ID])
        n = r[R.N_REWRITES] or 0
        dfs.append(max(n - 1, 1))
        reason = r[R.REASON] or ""
        if n < 3 or reason:
            t_stat.append(np.nan)
            p.append(np.nan)
            why.append(reason or f"only {n} rewrites (3 needed)")
            continue
        d0 = r[R.TARGET_ORIGINAL] - r[R.REFERENCE_ORIGINAL]
        d = np.asarray(r[R.TARGET_REWRITES], np.float64) - np.asarray(r[R.REFERENCE_REWRITES], np.float64)
        sd = d.std(ddof=1)
        if not np.isfinite(d0) or not np.isfinite(d).all() or sd <= 1e-9:
            t_stat.append(np.nan)
            p.append(np.nan)
            why.append("rewrites score identically" if sd <= 1e-9 else "a score is not finite")
            continue
        t = (d0 - d.mean()) / (sd * np.sqrt(1 + 1 / n))
        t_stat.append(float(t))
        p.append(float(stats.t.sf(t, df=n - 1)))
        why.append("")
    return {"task_id": ids, "t": np.asarray(t_stat), "p": np.asarray(p), "df": np.asarray(dfs, np.float64),
            "why": why}


def storey_pi0(p, lam: float = 0.5) -> float:
    """Storey (2002): the share of true nulls, from the p-values above ``lam`` (capped at 1)."""
    p = np.asarray(p, np.float64)
    if not len(p):
        raise BadInput("no p-values to estimate from")
    return float(min(1.0, np.mean(p > lam) / (1.0 - lam)))


def mixture_fraction(t, df, iters: int = 500) -> float:
    """The members' share by maximum likelihood: t ~ (1 - pi) t_df + pi N(mu, s^2), the null fixed
    (Student's t, exact under H0), the members' component free (mu >= 0). Counts members whose
    p-values are only moderately small, which Storey's pi0 (a bound) leaves among the nulls; but
    it leans on the null's whole shape, Storey's only on its upper half."""
    from scipy import stats

    t = np.asarray(t, np.float64)
    df = np.broadcast_to(np.asarray(df, np.float64), t.shape)
    f0 = stats.t.pdf(t, df)
    pi, mu, sd = 0.1, max(2.0, float(np.percentile(t, 90))), 1.5
    for _ in range(iters):
        f1 = stats.norm.pdf(t, mu, sd)
        r = pi * f1 / np.maximum(pi * f1 + (1 - pi) * f0, 1e-300)
        new = float(r.mean())
        if r.sum() > 1e-9:
            mu = max(0.0, float((r * t).sum() / r.sum()))
            sd = max(0.5, float(np.sqrt((r * (t - mu) ** 2).sum() / r.sum())))
        if abs(new - pi) < 1e-7:
            pi = new
            break
        pi = new
    return pi


def qvalues(p, pi0: float) -> np.ndarray:
    """Storey's q-values: the smallest FDR at which each task would be flagged."""
    p = np.asarray(p, np.float64)
    n = len(p)
    order = np.argsort(p)
    q = np.empty(n)
    q[order] = np.minimum.accumulate((pi0 * n * p[order] / np.arange(1, n + 1))[::-1])[::-1]
    return np.minimum(q, 1.0)


def null_check(p, lam: float = 0.5) -> dict:
    """Are the p-values above ``lam`` uniform on (lam, 1]? Under H0 they are, whatever the members
    do (a member's p-value is small), so a rejection says the null itself is off for this target:
    p-values piled just above lam mean the target prefers originals even where it saw nothing."""
    from scipy import stats

    p = np.asarray(p, np.float64)
    upper = (p[p > lam] - lam) / (1 - lam)
    if len(upper) < 10:
        return {"n": int(len(upper)), "ks_p": None, "ok": None,
                "why": f"only {len(upper)} p-values above {lam}: too few to test the null"}
    ks = stats.kstest(upper, "uniform")
    return {"n": int(len(upper)), "ks_stat": float(ks.statistic), "ks_p": float(ks.pvalue), "ok": bool(ks.pvalue >= 0.01),
            "mean_upper": float(upper.mean())}


def uniformity(p) -> dict:
    """KS test of all p-values against U(0, 1): what a clean target's must pass."""
    from scipy import stats

    p = np.asarray(p, np.float64)
    ks = stats.kstest(p, "uniform")
    return {"n": int(len(p)), "ks_stat": float(ks.statistic), "ks_p": float(ks.pvalue)}


def estimate(table, *, lam: float = 0.5, fdr: float = 0.1, n_boot: int = 1000, seed: int = 0,
             min_tasks: int = 30) -> dict:
    """The route's whole answer: per task p and q, the leaked fraction 1 - pi0 with a bootstrap
    95% interval, the flagged tasks at the given FDR, the null check, and whether a number may be
    printed (``usable``) or why not."""
    s = task_statistics(table)
    ok = np.isfinite(s["p"])
    p = s["p"][ok]
    out = {"route": "self-calibrated (original vs rewrites, relative to a reference model)",
           "n_tasks": len(s["task_id"]), "n_tested": int(ok.sum()), "lambda": lam, "fdr": fdr,
           "not_tested": {r: s["why"].count(r) for r in sorted(set(w for w in s["why"] if w))}}
    q = np.full(len(s["p"]), np.nan)
    if ok.sum() < min_tasks:
        out.update(usable=False, estimate=None, ci=[None, None],
                   why_unusable=f"only {int(ok.sum())} tasks could be tested ({min_tasks} needed)")
        return {**out, "per_task": {**s, "q": q, "flagged": np.zeros(len(q), bool)}}
    pi0 = storey_pi0(p, lam)
    q[ok] = qvalues(p, pi0)
    rng = np.random.default_rng(seed)
    boots = [1.0 - storey_pi0(p[rng.integers(0, len(p), len(p))], lam) for _ in range(int(n_boot))]
    lo, hi = np.percentile(boots, [2.5, 97.5]).tolist()
    check = null_check(p, lam)
    flagged = np.where(ok, q <= fdr, False)
    out.update(estimate=1.0 - pi0, ci=[float(lo), float(hi)], pi0=pi0, null_check=check,
               n_flagged=int(flagged.sum()), uniformity=uniformity(p),
               p_histogram=np.histogram(p, bins=10, range=(0, 1))[0].tolist())
    if check["ok"] is False:
        out.update(usable=False, why_unusable=(
            f"the null does not hold for this target: its p-values above {lam} are not uniform (KS p = "
            f"{check['ks_p']:.3g}); it prefers original spellings even where it shows no sign of having read "
            "them, e.g. because it is a much stronger model than the reference. Choose a reference model "
            "closer to the target (audit.reference_model)"))
    else:
        out["usable"] = True
    out["per_task"] = {**s, "q": q, "flagged": flagged}
    return out
