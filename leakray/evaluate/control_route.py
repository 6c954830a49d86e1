"""The control route: the null measured, not assumed, on tasks the target cannot have seen.

The user gives **control tasks** (`audit.control`, `--control NAME=PATH`): tasks of the
benchmark's kind that the model under audit cannot have read — written after its training cutoff,
or a benchmark's private held-out split. Each task, benchmark and control alike, gets the
self-calibrated route's statistic (`selfcal.likelihood_ratio`: how much more the target likes
the prompt and solution than a reference model does, per character), computed by the same code
on the same models (`protocols.control_scores`).

- **The statistic net of difficulty** (`adjust_for_difficulty`): s minus a robust regression of
  s on what the reference model alone says of the task (its likelihood per character) and the
  task's length, fitted on both sets pooled, without labels.
- **p-values** are conformal (Bates, Candès, Lei, Romano & Sesia 2023, "Testing for outliers
  with conformal p-values"): p_i = (1 + #{control scores >= s_i}) / (m + 1). A clean benchmark
  task exchangeable with the control tasks has a (super-)uniform p-value, whatever the shape
  of the null: no normal, no mixture, no "most tasks are clean" is assumed.
- **Has it seen the benchmark at all?** A one-sided Mann–Whitney test of the benchmark's scores
  against the control's: valid when the clean tasks are exchangeable with the control's, and it
  answers even when the share cannot be pinned down.
- **How much**: Storey's estimate 1 − π0 from the conformal p-values (λ = `audit.lam`), with a
  percentile bootstrap over the benchmark's tasks *and* the control's, and its one-sided 95%
  lower bound. It undercounts members whose score falls inside the clean range (their p-values
  land above λ): a conservative estimate, as a lower bound should be.
- **Which samples**: Benjamini–Hochberg at `audit.fdr` on the conformal p-values (FDR control
  holds for them: Bates et al., Theorem 3).

**The assumption, checked before any number**: the control tasks are like the benchmark's clean
tasks. What can be checked without knowing the leak is checked: the reference model's own
per-character log-likelihood and the texts' lengths must have the same distribution on both
sets (two-sample KS, p >= 0.01). A reference model that saw neither set measures only the tasks'
kind and difficulty there, so a difference means the control is another kind of task and its
null does not transfer. Too few control tasks (`MIN_CONTROL`) is refused too.

**What it cannot do**: with n benchmark tasks its interval has a floor. Even with both score
distributions known exactly (the Cramér–Rao bound of the mixture weight), 164 tasks at a
member AUC of 0.90 and 25% members give a 95% interval about 0.20 wide; with the member
distribution unknown it is wider (measured: docs/AUDIT.md). When the interval is wider than
`audit.max_width` the route prints no share, but still its test and its lower bound.
"""

from __future__ import annotations

import numpy as np

from leakray.errors import BadInput

FILE = "control_scores.parquet"  # written by protocols/control_scores.py, read by the audit report
MIN_CONTROL = 30  # fewer control tasks: a conformal p-value cannot go below 1/31, nor BH flag anything
EXCHANGEABLE_P = 0.01  # the two-sample KS level below which the control is not the benchmark's kind


def conformal_pvalues(x, control) -> np.ndarray:
    """p_i = (1 + #{c >= x_i}) / (m + 1): large scores (members) get small p-values."""
    x, c = np.asarray(x, np.float64), np.sort(np.asarray(control, np.float64))
    if not len(c):
        raise BadInput("no control scores to compare with")
    above = len(c) - np.searchsorted(c, x, side="left")  # #{c >= x}
    return (1.0 + above) / (len(c) + 1.0)


def bh_flags(p, fdr: float) -> np.ndarray:
    """Benjamini–Hochberg: the largest k with p_(k) <= fdr k / n; the k smallest p-values flagged
    (the BH-adjusted p-values, Storey's q-values with π0 = 1, at most ``fdr``)."""
    from leakray.evaluate.selfcal import qvalues

    p = np.asarray(p, np.float64)
    return qvalues(p, 1.0) <= fdr if len(p) else np.zeros(0, bool)


def leaked_share(p, lam: float) -> float:
    """1 − π0, Storey's π0 = #{p > λ} / (n (1 − λ)), capped at 1."""
    p = np.asarray(p, np.float64)
    return float(1.0 - min(1.0, np.mean(p > lam) / (1.0 - lam)))


def exchangeability(ref_bench, ref_control, len_bench, len_control) -> dict:
    """Are the control tasks the benchmark's kind? Two properties the leak cannot move: the
    reference model's per-character log-likelihood (kind and difficulty of the text) and the
    text's length, compared by two-sample KS. Both must hold (p >= EXCHANGEABLE_P)."""
    from scipy import stats

    out, bad = {}, []
    for name, a, b in (("reference_loglik_per_char", ref_bench, ref_control),
                       ("log_length", np.log(np.maximum(len_bench, 1)), np.log(np.maximum(len_control, 1)))):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        a, b = a[np.isfinite(a)], b[np.isfinite(b)]
        ks = stats.ks_2samp(a, b)
        out[name] = {"ks": float(ks.statistic), "p": float(ks.pvalue),
                     "median_benchmark": float(np.median(a)), "median_control": float(np.median(b))}
        if ks.pvalue < EXCHANGEABLE_P:
            bad.append(f"{name.replace('_', ' ')} (KS {ks.statistic:.2f}, p {ks.pvalue:.2g}; medians "
                       f"{np.median(a):.3g} vs {np.median(b):.3g})")
    out["ok"] = not bad
    if bad:
        out["why"] = ("the control tasks are not the benchmark's kind: they differ in " + " and ".join(bad)
                      + " — their scores are no null for the benchmark's")
    return out


STATISTIC = "(log p_target - log p_reference) of the prompt and solution per character"


def statistics(table) -> dict:
    """Per set ("benchmark", "control") of a `control_scores` table: task ids, the statistic s,
    the reference model's own log-likelihood per character, the text's length, and why a task has
    no s."""
    from leakray.schema import K

    rows = table.to_pylist()
    out = {}
    for which in ("benchmark", "control"):
        mine = [r for r in rows if r[K.SET] == which]
        s, ref, why = [], [], []
        for r in mine:
            chars = max(1, r[K.CHARS])
            if r[K.REASON]:
                s.append(np.nan)
                ref.append(np.nan)
            else:
                s.append((r[K.TARGET_SOLUTION] + r[K.TARGET_PROMPT] - r[K.REFERENCE_SOLUTION] - r[K.REFERENCE_PROMPT]) / chars)
                ref.append((r[K.REFERENCE_SOLUTION] + r[K.REFERENCE_PROMPT]) / chars)
            why.append(r[K.REASON])
        out[which] = {"task_id": [r[K.TASK_ID] for r in mine], "s": np.array(s, np.float64),
                      "ref": np.array(ref, np.float64), "chars": np.array([r[K.CHARS] for r in mine], np.float64),
                      "why": why}
    return out


def estimate_from_table(table, task_ids: list[str], **kw) -> dict:
    """`estimate_control` on a `control_scores` table, the benchmark's tasks in ``task_ids`` order."""
    st = statistics(table)
    b, c = st["benchmark"], st["control"]
    at = {t: i for i, t in enumerate(b["task_id"])}
    missing = [t for t in task_ids if t not in at]
    if missing:
        raise BadInput(f"{len(missing)} benchmark tasks have no control-route scores (e.g. {missing[0]})")
    idx = np.array([at[t] for t in task_ids], dtype=np.int64)
    return estimate_control(task_ids, b["s"][idx], [b["why"][i] for i in idx], c["s"], ref_bench=b["ref"][idx],
                            ref_control=c["ref"], len_bench=b["chars"][idx], len_control=c["chars"],
                            statistic=STATISTIC, **kw)


def adjust_for_difficulty(s_bench, s_control, ref_bench, ref_control, len_bench, len_control):
    """`selfcal.net_of_difficulty` fitted on benchmark and control tasks pooled. Taking the tasks'
    difficulty out narrows the clean tasks' spread (measured on the matrix's dose-16 target: members'
    AUC 0.89 -> 0.94; dose 4: 0.66 -> 0.70). No label is read, and the fit treats every task alike
    (a symmetric function of the pooled set, as in full conformal prediction), so clean benchmark
    tasks and control tasks stay exchangeable: the p-values keep their guarantee."""
    from leakray.evaluate.selfcal import net_of_difficulty

    n = len(np.asarray(s_bench))
    out, adjustment = net_of_difficulty(np.r_[np.asarray(s_bench, np.float64), np.asarray(s_control, np.float64)],
                                        np.r_[ref_bench, ref_control], np.r_[len_bench, len_control])
    return out[:n], out[n:], {k: v for k, v in adjustment.items() if k != "n"}


def estimate_control(task_ids, s, why, control_s, *, ref_bench, ref_control, len_bench, len_control,
                     lam: float = 0.5, fdr: float = 0.1, n_boot: int = 300, seed: int = 0, max_width: float = 0.3,
                     alpha: float = 0.05, statistic: str = "", adjust: bool = True, groups=()) -> dict:
    """The route's answer: the test, the leaked share with its interval and lower bound, p/q and
    flags per task, and whether the share may be printed (``usable``) or why not. ``adjust``: the
    statistic net of the tasks' difficulty (`adjust_for_difficulty`). ``groups``: the benchmark's
    near-copy groups (lists of task ids): the bootstrap draws each whole (`resample.task_resamples`)."""
    from scipy import stats

    from leakray.evaluate.resample import group_index, resampled_by, task_resamples
    from leakray.evaluate.selfcal import qvalues

    s = np.asarray(s, np.float64)
    c_all = np.asarray(control_s, np.float64)
    adjustment = None
    if adjust and np.isfinite(s).sum() >= MIN_CONTROL and np.isfinite(c_all).sum() >= MIN_CONTROL:
        s, c_all, adjustment = adjust_for_difficulty(s, c_all, ref_bench, ref_control, len_bench, len_control)
        statistic = f"{statistic or 'the statistic'}, net of the task's difficulty (Huber fit on the reference " \
                    "model's likelihood per character and the log length, all tasks pooled)"
    ok = np.isfinite(s)
    c = c_all[np.isfinite(c_all)]
    n = len(s)
    out = {"route": "control (conformal p-values against tasks the target cannot have seen)",
           "statistic": statistic, "n_tasks": n, "n_tested": int(ok.sum()), "n_control": int(len(c)),
           "n_control_given": int(len(c_all)), "lam": lam, "fdr": fdr, "max_width": max_width,
           "adjustment": adjustment,
           "not_tested": {r: list(why).count(r) for r in sorted(set(w for w in why if w))}}
    p, q, flagged = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool)
    per_task = {"task_id": list(task_ids), "s": s, "p": p, "q": q, "flagged": flagged}
    if len(c) < MIN_CONTROL or ok.sum() < MIN_CONTROL:
        return {**out, "usable": False, "detected": None, "estimate": None, "ci": [None, None], "per_task": per_task,
                "why_unusable": f"{len(c)} control tasks and {int(ok.sum())} benchmark tasks could be scored "
                                f"({MIN_CONTROL} of each needed)"}
    x = s[ok]
    ex = exchangeability(ref_bench, ref_control, len_bench, len_control)
    p[ok] = conformal_pvalues(x, c)
    m = len(x)
    q[ok] = qvalues(p[ok], 1.0)  # BH-adjusted p-values (Storey's with π0 = 1): flagged at q <= fdr
    flagged[ok] = q[ok] <= fdr
    mw = stats.mannwhitneyu(x, c, alternative="greater")
    est = leaked_share(p[ok], lam)
    rng = np.random.default_rng(seed)
    units = group_index([t for t, keep in zip(task_ids, ok) if keep], groups)
    # each resample's benchmark rows, then its control rows, from one stream (the draws as before groups)
    boots = np.array([leaked_share(conformal_pvalues(x[task_resamples(units, 1, rng)[0]],
                                                     c[rng.integers(0, len(c), len(c))]), lam)
                      for _ in range(int(n_boot))])
    out["resampled_by"] = resampled_by(units)
    lo, hi = np.percentile(boots, [2.5, 97.5]).tolist() if len(boots) else (est, est)
    lower = float(np.percentile(boots, 5)) if len(boots) else est  # one-sided 95% (bootstrap percentile)
    detected = bool(mw.pvalue < alpha)
    out.update(estimate=est, ci=[float(min(lo, est)), float(max(hi, est))], lower_bound=lower,
               test={"name": "one-sided Mann–Whitney U, benchmark > control", "p": float(mw.pvalue),
                     "auc": float(mw.statistic / (m * len(c))), "alpha": alpha},
               detected=detected, exchangeability=ex, p_histogram=np.histogram(p[ok], bins=10, range=(0, 1))[0].tolist())
    why_not = []
    if not ex["ok"]:
        why_not.append(ex["why"])
        flagged[:] = False  # no valid null: no flags, no test, no bound either
        out.update(detected=None, lower_bound=None)
    elif hi - lo > max_width:
        why_not.append(f"its 95% interval [{lo:.0%}, {hi:.0%}] is wider than {max_width:.0%} (too few benchmark or "
                       f"control tasks for how far members stand from clean tasks)"
                       + (f"; the benchmark's tasks do score above the control's (Mann–Whitney p {mw.pvalue:.2g})"
                          + (f": at least {lower:.0%} leaked (one-sided 95%)" if lower > 0 else "")
                          if detected else ""))
    out.update(usable=not why_not, **({"why_unusable": "; ".join(why_not)} if why_not else {}))
    out["n_flagged"] = int(flagged.sum())
    return {**out, "per_task": per_task}
