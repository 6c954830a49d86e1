"""Which number an audit prints, and the verdicts that go with it: one story per audit.

Three routes estimate the leaked fraction:
- **control** (`control_route`): with control tasks the target cannot have seen, the null is
  measured on them (conformal p-values), not assumed; first whenever its check holds.
- **self-calibrated** (`selfcal`): the target's likelihood of each solution relative to a reference
  model, with the null fitted on the target's own scores, so it needs no shadow that resembles the
  target. Needs the target's log-probabilities of given text.
- **card** (`card_route`): a shadow-trained detector's scores with the card's cut and error rates.
  Holds only where the target's scores are on the shadow's scale (checked by `transfer_check`).

`auto` prints the control route's estimate when control tasks were given and they are the
benchmark's kind; if its interval is too wide, another route's share only where it agrees with
that measured null, else the control route's test and lower bound. Without control tasks: the
self-calibrated estimate when its checks hold; else the card's when the card transfers — unless the self-calibrated route found the target's scores ambiguous (one normal fits:
clean, or a faint leak), which no card of a stronger leak can settle (a card whose shadow carries a
pretraining-mixture leak can, with a caveat naming its dose); else no number, with the reasons.
A fine-tune card's number where the self-calibrated route could not fit the target at all (no
log-probabilities of given text, as behind an API without `echo`) carries a caveat too: nothing
checked for the faint leak it cannot see. A "clean, or a faint leak" statement made without control
tasks ends by naming them (`next_step`).
The verdicts come from the route that printed the number: 'suspected' is controlled by a
false-discovery rate across the benchmark, so a benchmark estimated at 0% leaked flags (almost)
nothing.
"""

from __future__ import annotations

import numpy as np

from leakray.evaluate import card_route, selfcal
from leakray.evaluate.control_route import MIN_CONTROL

# what a statement of "clean, or a faint leak" ends with when no control tasks were given
CONTROL_HINT = (f"Control tasks would test for a faint leak directly: give --control NAME=PATH with at least "
                f"{MIN_CONTROL} tasks of the benchmark's kind that the target cannot have seen (written after its "
                "training cutoff)")


def card_estimate(target_score, val_y, val_s, prob, train_prior: float, *, fdr: float, seed: int = 0,
                  n_boot: int = 200, max_width: float = 1.0, groups=None) -> dict:
    """The card route on the target's scores (NaN = not scored: a learned detector's own training
    tasks are left out, so no target task is scored by a detector trained on it); ``groups``: one
    label per target task, a near-copy group drawn whole by the mixture's bootstrap."""
    t = np.asarray(target_score, np.float64)
    ok = np.isfinite(t)
    out = {"route": "card", "n_scored": int(ok.sum()), "n_tasks": int(len(t))}
    if ok.sum() < 20:
        return {**out, "usable": False, "estimate": None, "ci": [None, None],
                "why_unusable": f"only {int(ok.sum())} target tasks could be scored by the card's detector",
                "flagged": np.zeros(len(t), bool), "posterior": np.full(len(t), np.nan)}
    rates = card_route.crossfit_rates(val_y, val_s, seed)
    k = int((t[ok] >= rates["cut"]).sum())
    adj, adj_lo, adj_hi = card_route.adjusted_interval(k, int(ok.sum()), rates)
    # the estimate reads the target's whole score distribution against the card's two (a count
    # above one cut, Forman's adjusted count, is kept beside it: measured on a pretraining-mixture
    # card, its exact-bound interval spanned most of [0, 1] where the mixture weight's did not)
    units = None if groups is None else np.asarray(groups)[ok]
    mix = card_route.mixture_estimate(t[ok], val_y, val_s, n_boot=n_boot, seed=seed, groups=units)
    check = card_route.transfer_check(t[ok], val_y, val_s, n_boot=n_boot, seed=seed, groups=units)
    est, (lo, hi) = mix["estimate"], mix["ci"]
    out.update(estimate=est, ci=[lo, hi], rates={k_: v for k_, v in rates.items() if k_ != "cut"},
               cut=rates["cut"], flagged_share=k / ok.sum(), transfer=check, mixture=mix,
               adjusted_count={"estimate": adj, "ci": [adj_lo, adj_hi]})
    why = []
    if est is None:
        why.append(mix["why"])
    if not check["ok"]:
        why.append(check["why"])
    if est is not None and hi - lo > max_width:
        # measured: a pretraining-mixture card (primary AUC 0.77 on its shadow) gave 57% [2%, 100%]
        # for a target with 25% members; a point estimate inside such an interval means nothing
        f_lo, f_hi = mix["fixed_scale_ci"]
        if f_hi - f_lo <= max_width:
            # measured: the same kind of card at AUC 0.89 said 0% [0%, 13%] on its own scale for a target
            # with 25% members read 16 times; the shadow, which read twice as many, scored its
            # non-members 0.09 higher than the target scored its own
            sh = mix["shifted"]
            why.append(f"its 95% interval [{lo:.0%}, {hi:.0%}] is wider than {max_width:.0%}: on the card's own scale "
                       f"the share would be {mix['fixed_scale']:.0%} [{f_lo:.0%}, {f_hi:.0%}], but the target's scores fit as well with "
                       f"the card's moved by {sh['delta']:+.3g} ({sh['estimate']:.0%} [{sh['ci'][0]:.0%}, "
                       f"{sh['ci'][1]:.0%}]): they cannot tell fewer members from a shadow whose scale is not the "
                       "target's (a shadow that read more members scores its non-members higher too)")
        else:
            why.append(f"its 95% interval [{lo:.0%}, {hi:.0%}] is wider than {max_width:.0%}: the card's detector "
                       "separates members too weakly, on too few shadow tasks, to pin the share down")
    post = np.full(len(t), np.nan)
    flags = np.zeros(len(t), bool)
    post[ok], flags[ok] = card_route.posterior_flags(np.asarray(prob)[ok], train_prior, est or 0.0, fdr)
    out.update(usable=not why, posterior=post, flagged=flags, **({"why_unusable": "; ".join(why)} if why else {}))
    return out


def knows_faint_leaks(card_leak: dict | None) -> bool:
    """A card whose shadow read its members a few times among clean pretraining data has seen
    members that score near its non-members: its rates count faint leaks. A fine-tuned shadow's
    (or a card that does not say) have not."""
    return bool(card_leak) and card_leak.get("mode") == "pretrain-mix"


def decide(selfcal_result: dict | None, card_result: dict | None, route: str = "auto",
           card_leak: dict | None = None, control_result: dict | None = None) -> dict:
    """The leaked fraction the audit prints (or the statement that it cannot), and which route's
    verdicts the per-sample table uses. ``card_leak``: how the card's shadow saw its members.
    ``control_result``: the control route's, when control tasks were given."""
    if control_result is not None and route in ("auto", "control"):
        if control_result.get("usable"):  # its null is measured, not assumed: first when it holds
            return {"route": "control", "estimate": control_result["estimate"], "ci": control_result["ci"],
                    "statement": None, "lower_bound": control_result.get("lower_bound"), "flags_from": "control"}
        if route == "control":
            return _control_statement(control_result)
        if control_result.get("detected") is not None:
            # The control tasks are the benchmark's kind but its share is not pinned down. Another
            # route's number stands only where it agrees with this measured null (a strong leak's
            # self-calibrated share, say); otherwise the control route's test and bound are the answer
            # (a faint leak that the assumed nulls call "one normal fits" or "0%" is exactly what it sees).
            other = _assumed_null_routes(selfcal_result, card_result, route, card_leak, [])
            if other["estimate"] is not None and _agrees(other, control_result):
                return {**other, "control_check": "agrees with the control route's test and interval"}
            return _control_statement(control_result, other if other["estimate"] is not None else None)
    if route == "control":  # forced, and no control tasks were given
        return {"route": None, "estimate": None, "ci": [None, None],
                "statement": "the audit cannot estimate the leaked fraction for this target — control: not run "
                             "(audit.route=control needs control tasks: --control NAME=PATH)"}
    reasons = ["control: " + control_result["why_unusable"]] if control_result is not None else []
    out = _assumed_null_routes(selfcal_result, card_result, route, card_leak, reasons)
    if out["estimate"] is None and control_result is None and selfcal_result and selfcal_result.get("ambiguous"):
        # "clean, or a faint leak" is the one question the assumed nulls cannot settle; a measured
        # null can (docs/AUDIT.md, "The control route on a faint leak"): say what to give
        out["next_step"] = CONTROL_HINT
        out["statement"] += f". {CONTROL_HINT}"
    return out


def _agrees(other: dict, c: dict) -> bool:
    """Another route's number against the control route's: its interval must overlap the control's,
    and when the control's test found a leak its estimate must reach the control's lower bound (a
    "0%" beside a detected leak is no agreement, whatever its interval)."""
    lo, hi = other["ci"]
    c_lo, c_hi = c["ci"]
    if c.get("detected") and other["estimate"] < c["lower_bound"]:
        return False
    return not (lo > c_hi or hi < c_lo)


def _assumed_null_routes(selfcal_result: dict | None, card_result: dict | None, route: str,
                         card_leak: dict | None, reasons: list[str]) -> dict:
    """The self-calibrated and card routes (their nulls assumed or borrowed from a shadow)."""
    options = {"self-calibrated": selfcal_result, "card": card_result}
    order = ["self-calibrated", "card"] if route == "auto" else [route]
    if route == "auto" and selfcal_result and selfcal_result.get("ambiguous") and card_result \
            and card_result.get("usable") and knows_faint_leaks(card_leak):
        # The target's own scores leave a faint leak open, and this card was trained on one: its cut,
        # TPR and FPR were measured on members read `dose` times, so its count settles the question
        # for leaks about that strong (members read fewer times are undercounted: the caveat says so).
        return {"route": "card", "estimate": card_result["estimate"], "ci": card_result["ci"], "statement": None,
                "caveat": (f"the card's shadow read each member {card_leak.get('dose')} times in pretraining: the "
                           "estimate counts leaks about that strong or stronger; members read fewer times are "
                           "undercounted")}
    if route == "auto" and selfcal_result and selfcal_result.get("ambiguous") and card_result \
            and card_result.get("usable"):
        # The card only knows its shadow's leak (e.g. 15 epochs): members read a few times score like
        # its non-members, so its "few or none" cannot rule out the faint leak the target's own scores
        # leave open. Measured: pretraining-mixture targets with 25% members at doses 4 and 16 got
        # "0% [0, 5%]" from a card route that passed its transfer check (docs/AUDIT.md).
        lo, hi = card_result["ci"]
        return {"route": None, "estimate": None, "ci": [None, None], "statement": (
            "the audit cannot estimate the leaked fraction for this target — its own scores show no separate "
            f"leaked group, and the card route's {card_result['estimate']:.1%} (95% CI {lo:.1%}–{hi:.1%}) counts "
            "only leaks as strong as the card's shadow leak: a fainter one (a few exposures in pretraining) "
            "would look the same. Read it as: at most "
            f"{hi:.1%} of the tasks leaked that strongly; fainter leaks are not excluded"),
            "strong_leak_share": {"estimate": card_result["estimate"], "ci": [lo, hi]}}
    for name in order:
        r = options[name]
        if r is None:
            reasons.append(f"{name}: not run")
            continue
        if r.get("usable"):
            out = {"route": name, "estimate": r["estimate"], "ci": r["ci"], "statement": None}
            if name == "card" and not knows_faint_leaks(card_leak) and "ambiguous" not in (selfcal_result or {}):
                # The target's own scores were never fitted (no log-probabilities of given text, as
                # behind an API without `echo`, or too few tasks scored), so nothing checked for the
                # faint leak this card cannot see: the number stands for leaks as strong as its shadow's
                out["caveat"] = _unchecked_faint_caveat(card_leak, selfcal_result)
            return out
        reasons.append(f"{name}: {r.get('why_unusable')}")
    return {"route": None, "estimate": None, "ci": [None, None],
            "statement": "the audit cannot estimate the leaked fraction for this target — " + " | ".join(reasons)}


def _unchecked_faint_caveat(card_leak: dict | None, selfcal_result: dict | None) -> str:
    epochs = (card_leak or {}).get("epochs")
    shadow = f"fine-tuned on its members for {epochs} epochs" if epochs else "given a strong leak"
    why = (selfcal_result or {}).get("why_unusable") or "not run"
    return (f"the card's shadow was {shadow}: the estimate counts leaks about that strong. Whether a fainter "
            f"one (a few exposures in pretraining) is there was not checked: the self-calibrated route, which "
            f"would show it, could not fit the target's scores ({why}); control tasks "
            "(--control NAME=PATH) would test for it")


def _control_statement(c: dict, overruled: dict | None = None) -> dict:
    """No share from the control route: its test and lower bound when its null holds, else why not;
    ``overruled``: another route's number that disagreed with it (named, not printed)."""
    out = {"route": None, "estimate": None, "ci": [None, None], "control_test": c.get("test"),
           "lower_bound": c.get("lower_bound")}
    if c.get("detected") is None:  # too few tasks, or the control tasks are not the benchmark's kind
        return {**out, "statement": "the audit cannot estimate the leaked fraction for this target — control: "
                                    + str(c.get("why_unusable"))}
    out["flags_from"] = "control"  # its null holds: its flags control the FDR with or without a share
    p = c["test"]["p"]
    head = (f"the benchmark's tasks score above the control tasks (one-sided Mann–Whitney p {p:.2g}): the target "
            "has seen part of the benchmark"
            + (f", at least {c['lower_bound']:.1%} of its tasks (one-sided 95% bound)" if c["lower_bound"] > 0 else "")
            if c["detected"] else
            f"the benchmark's tasks do not score significantly above the control tasks (one-sided Mann–Whitney p "
            f"{p:.2g}): no leak shown, and none excluded")
    lo, hi = c["ci"]
    tail = "" if overruled is None else (
        f"; the {overruled['route']} route's {overruled['estimate']:.1%} ({overruled['ci'][0]:.1%}–"
        f"{overruled['ci'][1]:.1%}) disagrees with this measured null and is not printed")
    return {**out, "statement": f"{head}; the leaked fraction itself is not pinned down: the control route's "
                                f"{c['estimate']:.1%} has the 95% interval {lo:.1%}–{hi:.1%}, wider than "
                                f"{c['max_width']:.0%}{tail}"}


def flags_of(decision: dict, selfcal_result: dict | None, card_result: dict | None, n: int,
             control_result: dict | None = None) -> np.ndarray:
    """Per task: suspected by the route that gave the number; none when no number was given —
    except the control route's, whose flags (Benjamini–Hochberg on conformal p-values) control the
    FDR whenever its null holds, with or without a share."""
    if decision.get("flags_from") == "control":
        return np.asarray(control_result["per_task"]["flagged"], bool)
    if decision["route"] == "self-calibrated":
        return np.asarray(selfcal_result["per_task"]["flagged"], bool)
    if decision["route"] == "card":
        return np.asarray(card_result["flagged"], bool)
    return np.zeros(n, bool)


__all__ = ["card_estimate", "decide", "flags_of", "selfcal"]
