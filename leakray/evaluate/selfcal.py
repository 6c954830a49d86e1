"""The self-calibrated audit route: a per-task statistic whose null is estimated from the target's
own scores, so the route needs no shadow that resembles the target.

**The statistic** (`likelihood_ratio`): per task, how much more the model under audit likes the
reference solution than a reference model does, per character of the solution:
``s = (log p_target(solution | prompt) - log p_reference(solution | prompt)) / len(solution)``.
Log-probabilities of a string compare across tokenizers, and per character across tasks. Members
have a larger s. The route reads s **net of the task's difficulty** (`net_of_difficulty`, unless
`audit.net_of_difficulty: false`): s minus a robust regression on the reference model's own
likelihood per character and the log length, fitted on the target's tasks without labels. A
fine-tune raises its benchmark's shared format for every task, the short ones most per character;
left in, that spill-over put short clean tasks in the null's right tail, and the flags' false
share over `audit.fdr` (docs/AUDIT.md, "Weaker and smaller leaks").

**The null, from the target itself** (`empirical_null`, after Efron 2004, "the choice of a null
hypothesis"): a theoretical null would need s's distribution on a clean target relative to this
reference, which depends on the pair of models and which no audit has. Instead the scores are fitted
as a two-component normal mixture: the *null* component, assumed to hold most tasks (pi0 >= 0.5),
and a *member* component to its right (mean at least one null sd above the null's). Per task a
p-value under the fitted null, Storey-style q-values, and the leaked fraction 1 - pi0 with a
bootstrap interval (the whole fit repeated on resampled tasks).

**When it prints no number** (each stated in the report): one normal fits as well as the mixture
(BIC; then "0% leaked" would be a guess: a faint leak looks the same), the bootstrap interval is wider than
`max_width` (members and clean tasks do not separate: a faint leak, or a clean target whose score
distribution is merely skewed — the two look alike and the route will not guess), the fit sits at
pi0 = 0.5 (more than half the tasks look leaked, or the null cannot be told apart) or its bootstrap
interval reaches that bound (its upper end is then the assumption's, not the data's), or too few
tasks could be scored.

Measured, and kept as an option (`audit.rewrites > 0`): the same comparison against renamed
rewrites of each solution (`leakray.perturb.rewrite`, `task_statistics`) with a theoretical
Student-t null. Its null does not hold here: on a clean tiny target with the tiny-alt reference the
p-values are far from uniform (KS p 2e-11), because the original's names are more natural than any
rename and the two models weigh naturalness differently; and renaming cancels the memorised
structure, which carries most of the signal at low doses.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from leakray.errors import BadInput
from leakray.schema import C, R


def likelihood_ratio(table, text: str = "whole", keep_partial: bool = False) -> dict:
    """Per task of a collection: s (see the module doc) and why a task has none.

    ``text="whole"``: over the prompt and the solution together, as a model that read the sample in
    training saw it (the docstring is remembered too: on a tiny model that read a quarter of
    HumanEval 16 times among clean code, the members' AUC against its own pre-leak checkpoint went
    from 0.84 on the solution alone to 0.93). Falls back to the solution when the collection has no
    prompt log-probabilities (collected before they existed); ``statistic`` says which was used.
    ``keep_partial``: score a row whose text was cut to fit the model over what was scored (a
    detector must score every row; the route leaves such rows out)."""
    from leakray.data.tasks import continuation

    cols = table.column_names
    ids = table.column(C.TASK_ID).to_pylist()
    if C.REF_TOKEN_LOGPROBS not in cols or C.REFMODEL_TOKEN_LOGPROBS not in cols:
        return {"task_id": ids, "s": np.full(len(ids), np.nan), "statistic": None, "ref": np.full(len(ids), np.nan),
                "chars": np.full(len(ids), np.nan),
                "why": ["the collection has no reference-model column (columns.reference_model)"] * len(ids)}
    whole = text == "whole" and C.PROMPT_LOGPROB in cols and C.REFMODEL_PROMPT_LOGPROB in cols
    tgt, ref = table.column(C.REF_TOKEN_LOGPROBS).to_pylist(), table.column(C.REFMODEL_TOKEN_LOGPROBS).to_pylist()
    prompts, refs = table.column(C.PROMPT).to_pylist(), table.column(C.REFERENCE).to_pylist()
    notes = table.column(C.NOTES).to_pylist() if C.NOTES in cols else [[]] * len(ids)
    if whole:
        tgt_p = table.column(C.PROMPT_LOGPROB).to_pylist()
        ref_p = table.column(C.REFMODEL_PROMPT_LOGPROB).to_pylist()
    s, why = np.full(len(ids), np.nan), []
    ref_per_char, n_chars = np.full(len(ids), np.nan), np.full(len(ids), np.nan)  # `net_of_difficulty`'s inputs
    for i in range(len(ids)):
        cut = [n for n in (notes[i] or []) if "truncated" in n]
        if not tgt[i] or not ref[i]:
            why.append("the target or the reference model gave no log-probabilities for the solution")
        elif cut and not keep_partial:
            why.append(f"the solution was scored in part ({cut[0]})")
        elif whole and not (_finite(tgt_p[i]) and _finite(ref_p[i])):
            why.append("the target or the reference model gave no log-probabilities for the prompt")
        else:
            ref_ll = float(np.sum(ref[i]))
            delta = float(np.sum(tgt[i])) - ref_ll
            chars = len(continuation(prompts[i], refs[i]))
            if whole:
                delta += float(tgt_p[i]) - float(ref_p[i])
                ref_ll += float(ref_p[i])
                chars += len(prompts[i])
            s[i] = delta / max(1, chars)
            ref_per_char[i], n_chars[i] = ref_ll / max(1, chars), chars
            why.append("" if np.isfinite(s[i]) else "a log-probability is not finite")
    return {"task_id": ids, "s": s, "why": why, "ref": ref_per_char, "chars": n_chars,
            "statistic": f"(log p_target - log p_reference) of the {'prompt and solution' if whole else 'solution'} "
                         "per character"}


DIFFICULTY = ("net of the task's difficulty (a Huber fit on the reference model's likelihood per character and "
              "the log length)")


def net_of_difficulty(s, ref, chars) -> tuple[np.ndarray, dict]:
    """s minus what the task's kind predicts of it: a robust (Huber) regression of s on the reference
    model's log-likelihood per character (``ref``) and the log length (``chars``), over the tasks
    given, without labels. A task the reference model finds easy or hard, or a short or long one,
    moves s whatever the target saw. A fine-tune spills over onto the benchmark's own format too: a
    model fine-tuned on a fifth of HumanEval likes every HumanEval prompt more per character, and
    the more so the shorter the task (rank correlation of s with the length over its *clean* tasks
    -0.43 to -0.46; on the clean base 0.02). Left in, that puts short clean tasks in the null's right
    tail, where they are flagged (docs/AUDIT.md, "Weaker and smaller leaks"). A task with no
    s or covariate stays NaN."""
    from sklearn.linear_model import HuberRegressor

    s = np.asarray(s, np.float64)
    x = np.c_[np.asarray(ref, np.float64), np.log(np.maximum(np.asarray(chars, np.float64), 1))]
    ok = np.isfinite(s) & np.isfinite(x).all(1)
    out = np.full(len(s), np.nan)
    fit = HuberRegressor(max_iter=1000).fit(x[ok], s[ok])
    out[ok] = s[ok] - fit.predict(x[ok])
    return out, {"coef": fit.coef_.tolist(), "intercept": float(fit.intercept_),
                 "on": ["reference log-likelihood per character", "log length"], "n": int(ok.sum())}


def route_statistic(lr: dict, net: bool) -> tuple[np.ndarray, str | None, dict | None]:
    """(s, its description, the adjustment or None) as the route reads a `likelihood_ratio` result:
    net of difficulty when ``net`` (`audit.net_of_difficulty`) and enough tasks have a statistic
    to fit it on (fewer get no number anyway)."""
    s, statistic = lr["s"], lr["statistic"]
    if not net or np.isfinite(s).sum() < MIN_TASKS:
        return s, statistic, None
    s, adjustment = net_of_difficulty(s, lr["ref"], lr["chars"])
    return s, f"{statistic}, {DIFFICULTY}" if statistic else statistic, adjustment


def _finite(v) -> bool:
    return v is not None and bool(np.isfinite(v))


_SQRT_2PI = float(np.sqrt(2 * np.pi))


def _normal_pdf(x: np.ndarray, mu, sd) -> np.ndarray:
    # scipy.stats.norm.pdf's formula without its per-call argument checking, which cost 95% of an
    # EM step's time on 164 tasks
    z = (x - mu) / sd
    return np.exp(-0.5 * z * z) / (sd * _SQRT_2PI)


def empirical_null(x, iters: int = 500) -> dict:
    """Fit x ~ pi0 N(mu0, sd0) + (1 - pi0) N(mu1, sd1) by EM with pi0 in [0.5, 1] and
    mu1 >= mu0 + sd0 (members to the right of the null): the null component is the bulk."""
    return empirical_nulls(np.asarray(x, np.float64)[None, :], iters)[0]


def empirical_nulls(xs, iters: int = 500) -> list[dict]:
    """`empirical_null` of each row of ``xs`` (b samples of n tasks), all rows' EM steps at once:
    the bootstrap's 300 fits in one array (a row stops where it converged, as alone; the results are
    bit-identical to fitting the rows one by one, 10-20x faster)."""
    from scipy import stats

    xs = np.asarray(xs, np.float64)
    b, n = xs.shape
    mu0 = np.median(xs, axis=1)
    sd0 = stats.median_abs_deviation(xs, axis=1, scale="normal")
    sd0 = np.where(sd0 > 0, sd0, xs.std(axis=1))
    sd0 = np.where(sd0 > 0, sd0, 1e-6)
    pi0, mu1, sd1 = np.full(b, 0.9), mu0 + 2 * sd0, sd0.copy()
    live = np.ones(b, bool)
    for _ in range(iters):
        i = np.flatnonzero(live)
        if not len(i):
            break
        x = xs[i]
        f0 = pi0[i, None] * _normal_pdf(x, mu0[i, None], sd0[i, None])
        f1 = (1 - pi0[i, None]) * _normal_pdf(x, mu1[i, None], sd1[i, None])
        r0 = f0 / np.maximum(f0 + f1, 1e-300)
        r1 = 1 - r0
        new = np.clip(r0.mean(axis=1), 0.5, 1.0)
        m0 = (r0 * x).sum(axis=1) / r0.sum(axis=1)
        s0 = np.maximum(np.sqrt((r0 * (x - m0[:, None]) ** 2).sum(axis=1) / r0.sum(axis=1)), 1e-6)
        # the member component moves only where it holds some weight
        w1 = r1.sum(axis=1)
        has = w1 > 1e-6
        w1 = np.where(has, w1, 1.0)
        m1 = (r1 * x).sum(axis=1) / w1
        s1 = np.maximum(np.sqrt((r1 * (x - m1[:, None]) ** 2).sum(axis=1) / w1), 0.3 * s0)
        m1 = np.maximum(np.where(has, m1, mu1[i]), m0 + s0)
        done = np.abs(new - pi0[i]) < 1e-8
        mu0[i], sd0[i], mu1[i], sd1[i], pi0[i] = m0, s0, m1, np.where(has, s1, sd1[i]), new
        live[i[done]] = False
    # one normal (nothing leaked) unless the mixture earns its three extra parameters (BIC): a clean
    # target's near-normal scores are then "0 leaked", not a small spurious member component
    m, sd = xs.mean(axis=1), np.maximum(xs.std(axis=1), 1e-6)
    ll1 = stats.norm.logpdf(xs, m[:, None], sd[:, None]).sum(axis=1)
    mix = (pi0[:, None] * _normal_pdf(xs, mu0[:, None], sd0[:, None])
           + (1 - pi0[:, None]) * _normal_pdf(xs, mu1[:, None], sd1[:, None]))
    ll2 = np.log(np.maximum(mix, 1e-300)).sum(axis=1)
    one = -2 * ll2 + 5 * np.log(n) >= -2 * ll1 + 2 * np.log(n)
    return [{"pi0": 1.0, "mu0": float(m[j]), "sd0": float(sd[j]), "mu1": None, "sd1": None, "components": 1}
            if one[j] else {"pi0": float(pi0[j]), "mu0": float(mu0[j]), "sd0": float(sd0[j]), "mu1": float(mu1[j]),
                            "sd1": float(sd1[j]), "components": 2} for j in range(b)]


MIN_TASKS = 30  # fewer scored tasks: no fit, no number


def estimate_empirical(task_ids, s, why, *, fdr: float = 0.1, n_boot: int = 300, seed: int = 0,
                       max_width: float = 0.3, min_tasks: int = MIN_TASKS,
                       statistic: str = "(log p_target - log p_reference) of the solution per character",
                       groups=()) -> dict:
    """The route's answer from the per-task statistic: leaked fraction, interval, p/q per task,
    flags at the FDR, and whether the number may be printed (``usable``) or why not. ``groups``:
    the benchmark's near-copy groups (lists of task ids): the bootstrap draws each whole
    (`resample.task_resamples`)."""
    from scipy import stats

    from leakray.evaluate.resample import group_index, resampled_by, task_resamples

    s = np.asarray(s, np.float64)
    ok = np.isfinite(s)
    n = len(s)
    out = {"route": "self-calibrated (likelihood ratio to a reference model, empirical null from the target)",
           "statistic": statistic, "n_tasks": n, "n_tested": int(ok.sum()), "fdr": fdr, "max_width": max_width,
           "not_tested": {r: why.count(r) for r in sorted(set(w for w in why if w))}}
    p, q, flagged = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool)
    per_task = {"task_id": list(task_ids), "s": s, "p": p, "q": q, "flagged": flagged}
    if ok.sum() < min_tasks:
        commonest = Counter(w for w in why if w).most_common(1)  # why the others have no statistic
        reason = f": {commonest[0][0]} ({commonest[0][1]} tasks)" if commonest else ""
        return {**out, "usable": False, "estimate": None, "ci": [None, None], "per_task": per_task,
                "why_unusable": f"only {int(ok.sum())} tasks could be scored ({min_tasks} needed){reason}"}
    x = s[ok]
    fit = empirical_null(x)
    rng = np.random.default_rng(seed)
    units = group_index([t for t, keep in zip(task_ids, ok) if keep], groups)
    resamples = x[task_resamples(units, n_boot, rng)]
    out["resampled_by"] = resampled_by(units)
    boots = [1.0 - f["pi0"] for f in empirical_nulls(resamples)]
    lo, hi = np.percentile(boots, [2.5, 97.5]).tolist()
    p[ok] = stats.norm.sf(x, fit["mu0"], fit["sd0"])
    q[ok] = qvalues(p[ok], fit["pi0"])
    flagged[ok] = q[ok] <= fdr
    est = 1.0 - fit["pi0"]
    out.update(estimate=est, ci=[float(min(lo, est)), float(max(hi, est))], fit=fit,
               separation=None if fit["mu1"] is None else (fit["mu1"] - fit["mu0"]) / fit["sd0"],
               n_flagged=int(flagged.sum()),
               uniformity=uniformity(p[ok]), p_histogram=np.histogram(p[ok], bins=10, range=(0, 1))[0].tolist())
    why_not = []
    if fit["components"] == 1:
        why_not.append("no group of tasks stands out from the clean bulk (one normal fits the scores as well as a "
                       "mixture): the target may be clean, or its leak too faint for this reference model — members "
                       "that score within about two standard deviations of clean tasks look the same")
    elif hi - lo > max_width:
        why_not.append(f"its 95% interval [{lo:.0%}, {hi:.0%}] is wider than {max_width:.0%}: the target's scores do "
                       "not split into a clean bulk and a leaked group (a faint leak and a clean model with skewed "
                       "scores look alike)")
    if fit["pi0"] <= 0.5 + 1e-6:
        why_not.append("the fit puts half the tasks in the leaked group, the most its null assumption allows")
    elif fit["components"] == 2 and np.mean(np.asarray(boots) >= 0.5 - 1e-6) > 0.025:
        # the interval's upper end is the constraint, not the data: a benchmark leaked at 60% gives
        # the same fits (at 50%), so "50% [42%, 50%]" would not cover it. (Where one normal fits, the
        # reason above already says no share; "at least 0% look leaked" would only add noise.)
        why_not.append("its 95% interval reaches 50%, the most its null assumption (most tasks clean) allows: the "
                       "share may be higher than this route can show"
                       + (f"; at least {lo:.0%} of the tasks look leaked" if lo >= 0.005 else ""))
    # ambiguous: a faint leak cannot be excluded, so no other route's "few or none" may stand either
    out.update(usable=not why_not, ambiguous=fit["components"] == 1,
               **({"why_unusable": "; ".join(why_not)} if why_not else {}))
    return {**out, "per_task": per_task}


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


def qvalues(p, pi0: float) -> np.ndarray:
    """Storey's q-values: the smallest FDR at which each task would be flagged."""
    p = np.asarray(p, np.float64)
    n = len(p)
    order = np.argsort(p)
    q = np.empty(n)
    q[order] = np.minimum.accumulate((pi0 * n * p[order] / np.arange(1, n + 1))[::-1])[::-1]
    return np.minimum(q, 1.0)


def null_check(p, lam: float = 0.5, min_upper: int = 20) -> dict:
    """Are the p-values above ``lam`` uniform on (lam, 1]? Under H0 they are, whatever the members
    do (a member's p-value is small), so a rejection says the null itself is off for this target:
    p-values piling toward lam mean the target prefers originals even where it saw nothing. Two
    tests: KS against uniform, and (more powerful against that one-sided drift) a binomial test
    of the lower half of (lam, 1] against the upper half. Too few p-values above lam to test is a
    failure too: the null cannot be checked, and a null that cannot be checked is not trusted."""
    from scipy import stats

    p = np.asarray(p, np.float64)
    upper = (p[p > lam] - lam) / (1 - lam)
    if len(upper) < min_upper:
        return {"n": int(len(upper)), "ks_p": None, "binomial_p": None, "ok": False,
                "why": f"only {len(upper)} p-values above {lam} ({min_upper} needed): the null cannot be checked"}
    ks = stats.kstest(upper, "uniform")
    low = int((upper <= 0.5).sum())
    binom = stats.binomtest(low, len(upper), 0.5, alternative="greater").pvalue
    ok = bool(ks.pvalue >= 0.01 and binom >= 0.01)
    return {"n": int(len(upper)), "ks_stat": float(ks.statistic), "ks_p": float(ks.pvalue),
            "binomial_p": float(binom), "lower_half_share": low / len(upper), "ok": ok,
            **({} if ok else {"why": f"the p-values above {lam} are not uniform (KS p {ks.pvalue:.3g}, "
                                     f"{low}/{len(upper)} in their lower half, binomial p {binom:.3g})"})}


def uniformity(p) -> dict:
    """KS test of all p-values against U(0, 1): what a clean target's must pass."""
    from scipy import stats

    p = np.asarray(p, np.float64)
    ks = stats.kstest(p, "uniform")
    return {"n": int(len(p)), "ks_stat": float(ks.statistic), "ks_p": float(ks.pvalue)}


def estimate_rewrites(table, *, lam: float = 0.5, fdr: float = 0.1, n_boot: int = 1000, seed: int = 0,
             min_tasks: int = 30) -> dict:
    """The optional rewrite test (theoretical null; see the module doc): per task p and q, 1 - pi0 with a bootstrap
    95% interval, the flagged tasks at the given FDR, the null check, and whether a number may be
    printed (``usable``) or why not."""
    s = task_statistics(table)
    ok = np.isfinite(s["p"])
    p = s["p"][ok]
    out = {"route": "rewrite test (original vs renamed rewrites, relative to a reference model, t null)",
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
    if not check["ok"]:
        out.update(usable=False, why_unusable=(
            f"the null does not hold for this target ({check['why']}): it prefers original spellings even where "
            "it shows no sign of having read them, e.g. because it learnt more code than the reference model "
            "did. Choose a reference model closer to the target (audit.reference_model)"))
    else:
        out["usable"] = True
    out["per_task"] = {**s, "q": q, "flagged": flagged}
    return out
