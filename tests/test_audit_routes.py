"""The audit's two routes on fixtures whose truth is known: the self-calibrated test's null, the
card route's transfer check, exact rates, and one story between the number and the verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from leakray.evaluate import card_route, selfcal
from leakray.evaluate.audit_routes import CONTROL_HINT, card_estimate, decide, flags_of
from leakray.evaluate.control_route import MIN_CONTROL
from leakray.schema import R


def rewrite_rows(n_tasks: int, members: set[int], shift: float, rng, bias: float = 0.0, m: int = 16) -> list[dict]:
    """Synthetic rewrite scores: per task a difficulty offset, the reference model's view, and a
    target that (for members) likes the original by ``shift`` nats more; ``bias``: a clean target
    that prefers every original (a null that does not hold)."""
    rows = []
    for i in range(n_tasks):
        base = rng.normal(-60, 15)
        ref = base + rng.normal(0, 3, m + 1)
        tgt = ref + rng.normal(5, 2) + rng.normal(0, 1.5, m + 1)  # target and reference differ per task
        tgt[0] += bias + (shift if i in members else 0.0)
        rows.append({R.TASK_ID: f"T/{i}", R.N_REWRITES: m, R.REASON: "", R.TARGET_ORIGINAL: tgt[0],
                     R.TARGET_REWRITES: list(tgt[1:]), R.REFERENCE_ORIGINAL: ref[0], R.REFERENCE_REWRITES: list(ref[1:])})
    return rows


def _lr(values):
    return [str(i) for i in range(len(values))], np.asarray(values), [""] * len(values)


def test_self_calibrated_route_estimates_a_separable_leak():
    rng = np.random.default_rng(7)
    for share in (0.2, 0.4):
        n_mem = int(share * 164)
        x = np.r_[rng.normal(0.0, 0.3, 164 - n_mem), rng.normal(2.0, 0.4, n_mem)]
        res = selfcal.estimate_empirical(*_lr(x), n_boot=200)
        assert res["usable"] and abs(res["estimate"] - share) <= 0.05 and res["ci"][0] <= share <= res["ci"][1]
        flagged = res["per_task"]["flagged"]
        assert flagged[164 - n_mem:].mean() >= 0.9  # the members found
        assert flagged[:164 - n_mem].sum() <= 0.15 * flagged.sum()  # false leaks among the flagged: the FDR (0.1)


def test_self_calibrated_route_prints_no_share_its_assumption_caps():
    """A benchmark leaked at 50% or 60% fits at the route's bound (half the tasks clean); one leaked
    at 47% fits below it, but its bootstrap reaches the bound: either interval would end at 50%
    whatever the truth, so no share is printed, only how many at least."""
    rng = np.random.default_rng(11)
    for share in (0.47, 0.5, 0.6):
        n_mem = int(share * 164)
        x = np.r_[rng.normal(0.0, 0.3, 164 - n_mem), rng.normal(2.0, 0.4, n_mem)]
        res = selfcal.estimate_empirical(*_lr(x), n_boot=200)
        why = res.get("why_unusable") or ""
        assert not res["usable"] and ("half the tasks" in why or "reaches 50%" in why), (share, res["ci"])
        if share < 0.5:
            assert res["estimate"] < 0.5 and "reaches 50%" in why
        assert res["ci"][0] > 0.3  # the lower end still says a large share leaked


@pytest.mark.parametrize("case", ["clean", "faint"])
def test_self_calibrated_route_never_says_zero_with_certainty(case):
    """A clean target and a faint leak (members 1.4 null sds up) look alike: one normal fits both,
    so the route gives no number rather than a confident 0% about a leaked model."""
    rng = np.random.default_rng(8)
    x = rng.normal(0.3, 0.14, 164) if case == "clean" else np.r_[rng.normal(0.3, 0.14, 123), rng.normal(0.5, 0.14, 41)]
    res = selfcal.estimate_empirical(*_lr(x), n_boot=100)
    assert not res["usable"] and "no group of tasks stands out" in res["why_unusable"]
    assert res["uniformity"]["ks_p"] > 0.01 and res["n_flagged"] <= 0.05 * 164


def test_one_normal_is_the_reason_even_where_the_bootstrap_reaches_the_bound():
    """Found in the matrix (mix-d4): one normal fits, some resamples fit at the 50% bound, and the
    reason went on "...; at least 0% of the tasks look leaked". The one-normal reason says it all."""
    rng = np.random.default_rng(5)  # a faint leak whose resamples reach the bound (ci [0, 0.5])
    x = np.r_[rng.normal(0.3, 0.14, 123), rng.normal(0.5, 0.14, 41)]
    res = selfcal.estimate_empirical(*_lr(x), n_boot=200)
    assert res["ci"][1] >= 0.5 - 1e-6 and res["ambiguous"] and not res["usable"]
    assert "no group of tasks stands out" in res["why_unusable"] and "at least" not in res["why_unusable"]


def test_self_calibrated_route_refuses_a_skewed_clean_target_rather_than_guessing():
    rng = np.random.default_rng(0)
    x = 0.2 + 0.05 * rng.gamma(4, 1, 164)
    res = selfcal.estimate_empirical(*_lr(x), n_boot=200)
    assert not res["usable"]


def test_the_bootstraps_fits_at_once_are_the_fits_one_by_one():
    """`empirical_nulls` runs every resample's EM in one array; each row must stop where it would
    alone and give the same fit."""
    rng = np.random.default_rng(5)
    # members half a null sd up: EM creeps, and rows stop after different numbers of steps
    x = np.r_[rng.normal(0.0, 0.3, 120), rng.normal(0.5, 0.3, 44)]
    rows = np.stack([x, rng.normal(0, 1, 164), 0.05 * rng.gamma(4, 1, 164)]
                    + [x[rng.integers(0, 164, 164)] for _ in range(20)])
    together = selfcal.empirical_nulls(rows)
    assert {f["components"] for f in together} == {1, 2}  # both outcomes are exercised
    assert together == [selfcal.empirical_null(r) for r in rows]


def test_rewrite_test_p_values_are_uniform_on_a_clean_target():
    rng = np.random.default_rng(0)
    res = selfcal.estimate_rewrites(rewrite_rows(400, set(), 0.0, rng), n_boot=200)
    assert res["uniformity"]["ks_p"] > 0.01
    assert res["estimate"] <= 0.08 and res["ci"][0] <= 0.0 + 1e-9
    assert res["n_flagged"] <= 0.05 * 400 and res["usable"]


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_rewrite_test_estimates_a_clear_leak(share):
    rng = np.random.default_rng(1)
    n = 200
    members = set(rng.permutation(n)[: int(share * n)].tolist())
    res = selfcal.estimate_rewrites(rewrite_rows(n, members, 12.0, rng), n_boot=300)
    assert abs(res["estimate"] - share) <= 0.1
    assert res["ci"][0] <= share <= res["ci"][1]
    flagged = {int(t.split("/")[1]) for t, f in zip(res["per_task"]["task_id"], res["per_task"]["flagged"]) if f}
    assert len(flagged - members) <= max(2, 0.15 * len(flagged))  # FDR 0.1, with slack for one draw


def test_rewrite_test_refuses_when_its_null_does_not_hold():
    """A clean target that prefers every original (a far stronger model than the reference):
    the p-values above lambda pile up near it, the check fails and no number is given."""
    rng = np.random.default_rng(2)
    res = selfcal.estimate_rewrites(rewrite_rows(300, set(), 0.0, rng, bias=2.0), n_boot=100)
    assert res["usable"] is False and "null does not hold" in res["why_unusable"]


def test_rewrite_test_says_why_a_task_is_not_tested():
    rows = [{R.TASK_ID: "a", R.N_REWRITES: 0, R.REASON: "no locals", R.TARGET_ORIGINAL: np.nan,
             R.TARGET_REWRITES: [], R.REFERENCE_ORIGINAL: np.nan, R.REFERENCE_REWRITES: []}]
    res = selfcal.estimate_rewrites(rows)
    assert res["usable"] is False and res["not_tested"] == {"no locals": 1}


def test_clopper_pearson_is_exact_at_zero():
    lo, hi = card_route.clopper_pearson(0, 41)
    assert lo == 0.0 and 0.08 < hi < 0.09  # 0 false positives in 41 still allows an FPR near 8.6%
    assert card_route.clopper_pearson(41, 41)[1] == 1.0


def _card_rows(rng, n=41):
    y = np.r_[np.ones(n), np.zeros(n)].astype(int)
    s = np.r_[rng.normal(3, 1, n), rng.normal(0, 1, n)]
    return y, s


def test_transfer_check_refuses_a_shifted_target_without_members():
    """The issue's toy: target scores shifted by 1.5 shadow sds, no member at all."""
    rng = np.random.default_rng(3)
    y, s = _card_rows(rng)
    target = rng.normal(1.5, 1, 164)
    res = card_estimate(target, y, s, np.full(164, 0.5), 0.5, fdr=0.1, n_boot=200)
    assert res["usable"] is False and "not on the shadow's scale" in res["why_unusable"]


def test_card_route_holds_on_a_target_of_the_cards_kind():
    rng = np.random.default_rng(4)
    y, s = _card_rows(rng)
    n, share = 164, 0.2
    member = rng.random(n) < share
    target = np.where(member, rng.normal(3, 1, n), rng.normal(0, 1, n))
    from sklearn.linear_model import LogisticRegression

    prob = LogisticRegression().fit(s[:, None], y).predict_proba(target[:, None])[:, 1]
    res = card_estimate(target, y, s, prob, 0.5, fdr=0.1, n_boot=200)
    assert res["usable"], res.get("why_unusable")
    assert res["ci"][0] <= member.mean() <= res["ci"][1] and abs(res["estimate"] - member.mean()) <= 0.1
    assert res["ci"][1] - res["ci"][0] > 0  # never a [x, x] interval from finite rows


def test_card_route_at_zero_has_a_real_upper_bound_and_flags_nothing():
    rng = np.random.default_rng(5)
    y, s = _card_rows(rng)
    target = rng.normal(0, 1, 164)
    res = card_estimate(target, y, s, np.full(164, 0.05), 0.5, fdr=0.1, n_boot=200)
    assert res["ci"][0] == 0.0 and res["ci"][1] > 0.0 and res["estimate"] <= 0.1  # 41 negatives: noisy FPR
    assert res["flagged"].sum() <= 0.05 * 164


def test_decide_prefers_the_self_calibrated_route_and_states_when_none_holds():
    good = {"usable": True, "estimate": 0.2, "ci": [0.1, 0.3]}
    bad = {"usable": False, "why_unusable": "reason A"}
    assert decide(good, bad)["route"] == "self-calibrated"
    assert decide(bad, good)["route"] == "card"
    d = decide(bad, {"usable": False, "why_unusable": "reason B"})
    assert d["estimate"] is None and "reason A" in d["statement"] and "reason B" in d["statement"]
    assert not flags_of(d, None, None, 5).any()


def test_the_reference_model_is_never_the_targets_own_base_by_default():
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.protocols.audit import reference_for, target_reference

    cfg = load_config([AUDIT_DEFAULTS], [], AuditConfig)
    assert cfg.audit.reference_model == "auto"
    assert target_reference(cfg) == "tiny-alt"  # planted tiny target
    alt = load_config([AUDIT_DEFAULTS], ["audit.planted_base=tiny-alt"], AuditConfig)
    assert target_reference(alt) == "tiny" and reference_for(alt, "tiny") == "tiny-alt"  # the card's shadow
    shadow_alt = load_config([AUDIT_DEFAULTS], ["model.base=tiny-alt"], AuditConfig)  # a tiny-alt card
    assert target_reference(shadow_alt) == "tiny"
    chosen = load_config([AUDIT_DEFAULTS], ["audit.reference_model=tiny"], AuditConfig)
    assert target_reference(chosen) == "tiny"  # what the user names wins


def test_audit_config_takes_the_other_local_architecture_and_refuses_nonsense():
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.errors import BadInput

    cfg = load_config([AUDIT_DEFAULTS], ["model.base=tiny-alt", "audit.planted_base=tiny"], AuditConfig)
    assert cfg.model.base == "tiny-alt" and cfg.audit.planted_base == "tiny"
    for bad in ("audit.reference_model=./no/such/dir", "audit.fdr=1.5", "audit.max_width=0"):
        with pytest.raises(BadInput):
            load_config([AUDIT_DEFAULTS], [bad], AuditConfig)


def test_a_cards_few_or_none_does_not_stand_when_a_faint_leak_cannot_be_excluded():
    """The measured failure: pretraining-mixture targets (25% members, doses 4 and 16) passed the
    card's transfer check and got 0% [0, 5%]; their own scores fitted one normal."""
    ambiguous = {"usable": False, "ambiguous": True, "why_unusable": "no group of tasks stands out"}
    card = {"usable": True, "estimate": 0.0, "ci": [0.0, 0.05]}
    d = decide(ambiguous, card)
    assert d["estimate"] is None and "fainter leaks are not excluded" in d["statement"]
    assert d["strong_leak_share"]["ci"] == [0.0, 0.05]
    assert decide(ambiguous, card, route="card")["estimate"] == 0.0  # asked for by name: the user's call
    boundary = {"usable": False, "ambiguous": False, "why_unusable": "half the tasks"}
    assert decide(boundary, {"usable": True, "estimate": 0.54, "ci": [0.36, 0.73]})["route"] == "card"


def test_clean_or_faint_names_what_would_settle_it():
    """"Clean, or a faint leak" ends with what the user can give to tell them apart (control tasks);
    a statement with another reason, or one made with control tasks given, does not."""
    ambiguous = {"usable": False, "ambiguous": True, "why_unusable": "no group of tasks stands out"}
    for card in ({"usable": True, "estimate": 0.0, "ci": [0.0, 0.05]}, {"usable": False, "why_unusable": "KS 0.5"},
                 None):
        d = decide(ambiguous, card)
        assert d["next_step"] == CONTROL_HINT and d["statement"].endswith(CONTROL_HINT), card
        assert "--control NAME=PATH" in CONTROL_HINT and f"at least {MIN_CONTROL} tasks" in CONTROL_HINT
    not_ambiguous = {"usable": False, "ambiguous": False, "why_unusable": "only 3 tasks could be scored"}
    assert "next_step" not in decide(not_ambiguous, None) and "--control" not in decide(not_ambiguous, None)["statement"]
    unusable_control = {"usable": False, "detected": None, "why_unusable": "too few control tasks"}
    d = decide(ambiguous, None, control_result=unusable_control)
    assert "next_step" not in d and "too few control tasks" in d["statement"]


def test_too_few_scored_tasks_names_the_commonest_reason():
    x = np.full(40, np.nan)
    x[:3] = [0.1, 0.2, 0.3]
    why = [""] * 3 + ["the target or the reference model gave no log-probabilities for the solution"] * 37
    res = selfcal.estimate_empirical([f"t{i}" for i in range(40)], x, why, n_boot=10)
    assert res["why_unusable"] == ("only 3 tasks could be scored (30 needed): the target or the reference model "
                                   "gave no log-probabilities for the solution (37 tasks)")


def test_a_card_number_whose_faint_leak_check_could_not_run_says_so():
    """Behind an API without `echo` the self-calibrated route cannot fit the target's scores, so
    nothing checks for the faint leak a fine-tune card cannot see; the card's number (measured: a
    clean target behind such an endpoint got 0.0% [0.0%, 4.5%]) carries that caveat."""
    not_run = {"usable": False, "estimate": None, "why_unusable": "only 0 tasks could be scored (30 needed)"}
    card = {"usable": True, "estimate": 0.0, "ci": [0.0, 0.045]}
    for sc in (not_run, None):
        d = decide(sc, card, card_leak={"mode": "finetune", "epochs": 15})
        assert d["route"] == "card" and d["estimate"] == 0.0 and d["statement"] is None
        assert "15 epochs" in d["caveat"] and "was not checked" in d["caveat"] and "--control" in d["caveat"]
    assert "only 0 tasks could be scored" in decide(not_run, card)["caveat"]
    # checked and not ambiguous (a leaked group was fitted, its interval too wide): no caveat
    wide = {"usable": False, "ambiguous": False, "estimate": 0.5, "why_unusable": "half the tasks"}
    assert "caveat" not in decide(wide, card, card_leak={"mode": "finetune", "epochs": 15})
    # a card that knows faint leaks needs no such caveat
    assert "caveat" not in decide(not_run, card, card_leak={"mode": "pretrain-mix", "dose": 16})


def test_primary_on_a_tie_is_a_detector_that_learnt_nothing():
    from types import SimpleNamespace

    from leakray.report.audit import choose_primary

    def entry(auc, learns):
        return {"validation": {"auc": auc}, "spec": {"learns": learns}}

    card = SimpleNamespace(meta={"detectors": {"codemi": entry(1.0, True), "ref_loss": entry(1.0, False),
                                               "zlib": entry(0.9, False), "cgmia": entry(0.95, True)}})
    # codemi sorts first by name, but cross-fitting would leave it half the benchmark
    assert choose_primary(card, ["codemi", "ref_loss", "zlib", "cgmia"], None) == "ref_loss"
    assert choose_primary(card, ["codemi", "zlib", "cgmia"], None) == "codemi"  # the best AUC still wins
    assert choose_primary(card, ["codemi", "ref_loss"], "codemi") == "codemi"  # asked for by name


def test_a_card_trained_on_a_pretraining_mixture_settles_an_ambiguous_target_with_a_caveat():
    ambiguous = {"usable": False, "ambiguous": True, "why_unusable": "no group of tasks stands out"}
    card = {"usable": True, "estimate": 0.22, "ci": [0.1, 0.35]}
    d = decide(ambiguous, card, card_leak={"mode": "pretrain-mix", "dose": 16})
    assert d["route"] == "card" and d["estimate"] == 0.22 and d["ci"] == [0.1, 0.35]
    assert "16 times" in d["caveat"] and d["statement"] is None
    # a fine-tuned shadow (or a card that does not say how its shadow leaked) still cannot settle it
    for leak in ({"mode": "finetune", "epochs": 15}, None):
        assert decide(ambiguous, card, card_leak=leak)["estimate"] is None
    # an unusable card settles nothing, whatever its shadow saw
    d = decide(ambiguous, {"usable": False, "why_unusable": "does not transfer"},
               card_leak={"mode": "pretrain-mix", "dose": 16})
    assert d["estimate"] is None and "does not transfer" in d["statement"]


def test_audit_config_builds_pretrain_mix_shadows_and_refuses_a_dose_sweep():
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.errors import BadInput
    from leakray.protocols.audit import card_meta, shadow_leak

    cfg = load_config([AUDIT_DEFAULTS], ["leak.mode=pretrain-mix", "leak.dose=16"], AuditConfig)
    assert shadow_leak(cfg) == {"mode": "pretrain-mix", "dose": 16, "steps": cfg.leak.steps}
    assert card_meta(cfg, [], "/b")["shadow"]["leak"]["dose"] == 16
    assert shadow_leak(load_config([AUDIT_DEFAULTS], [], AuditConfig))["mode"] == "finetune"
    with pytest.raises(BadInput, match="dose-sweep"):
        load_config([AUDIT_DEFAULTS], ["leak.mode=dose-sweep"], AuditConfig)


def test_card_route_gives_no_number_when_its_interval_says_nothing():
    """The measured case: a card whose detector separates its shadow's members weakly (AUC ~0.77)
    gave 57% [2%, 100%] for a target with 25% members. Too wide: no number, the interval reported."""
    rng = np.random.default_rng(6)
    n = 41
    y = np.r_[np.ones(n), np.zeros(n)].astype(int)
    s = np.r_[rng.normal(1.0, 1, n), rng.normal(0, 1, n)]  # AUC about 0.76
    member = rng.random(164) < 0.25
    target = np.where(member, rng.normal(1.0, 1, 164), rng.normal(0, 1, 164))
    res = card_estimate(target, y, s, np.full(164, 0.3), 0.5, fdr=0.1, n_boot=200, max_width=0.3)
    assert res["ci"][1] - res["ci"][0] > 0.3
    assert not res["usable"] and "wider than 30%" in res["why_unusable"] and res["estimate"] is not None
    d = decide({"usable": False, "ambiguous": True, "why_unusable": "no group"}, res,
               card_leak={"mode": "pretrain-mix", "dose": 16})
    assert d["estimate"] is None and "wider than 30%" in d["statement"]


def test_the_report_names_how_the_cards_shadow_leaked():
    from types import SimpleNamespace

    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.report.audit import shadow_vs_target
    from leakray.report.audit_markdown import leak_words

    cfg = load_config([AUDIT_DEFAULTS], [], AuditConfig)
    mix = SimpleNamespace(meta={"shadow": {"base": "tiny", "leak": {"mode": "pretrain-mix", "dose": 16, "steps": 300}}})
    assert shadow_vs_target(mix, cfg)["shadow_leak"]["dose"] == 16
    before_leak_kinds = SimpleNamespace(meta={"shadow": {"base": "tiny"}})  # cards made before this was recorded
    assert shadow_vs_target(before_leak_kinds, cfg)["shadow_leak"] == {"mode": "finetune"}
    assert leak_words({"mode": "pretrain-mix", "dose": 16}) == "read each member 16 times in pretraining"
    assert leak_words({"mode": "finetune", "epochs": 15}) == "was fine-tuned on its members for 15 epochs"


def _faint_card(rng, n=82, shift=1.8):
    """A card whose members sit `shift` sds above its non-members (a pretraining-mixture leak read
    16 times measured about 1.8 against its pre-leak checkpoint), 82 + 82 shadow rows."""
    y = np.r_[np.ones(n), np.zeros(n)].astype(int)
    return y, np.r_[rng.normal(shift, 1, n), rng.normal(0, 1, n)]


@pytest.mark.parametrize("share", [0.0, 0.25])
def test_a_faint_cards_share_is_not_printed_when_the_scale_cannot_be_pinned(share):
    """Members 1.8 sds above non-members (a pretraining-mixture card): on the card's own scale the
    mixture weight is right and narrower than a count above a cut, but with members the target's
    scores fit as well with the card moved (fewer members, or the same members on a lower scale: a
    shadow that read more members spills over onto its non-members), so the route gives no number
    and says why."""
    rng = np.random.default_rng(11)
    y, s = _faint_card(rng)
    member = rng.random(164) < share
    target = np.where(member, rng.normal(1.8, 1, 164), rng.normal(0, 1, 164))
    res = card_estimate(target, y, s, np.full(164, 0.3), 0.5, fdr=0.1, n_boot=200, max_width=0.3)
    fixed = res["mixture"]["fixed_scale_ci"]
    assert abs(res["mixture"]["fixed_scale"] - member.mean()) <= 0.1 and fixed[0] <= member.mean() <= fixed[1]
    adj = res["adjusted_count"]["ci"]
    assert adj[1] - adj[0] > fixed[1] - fixed[0]  # the cut's exact-bound interval is wider
    if share:
        assert not res["usable"] and "cannot tell fewer members from a shadow whose scale" in res["why_unusable"]
    else:  # no member: nothing to trade against the scale; "none" holds
        assert res["usable"] and res["estimate"] <= 0.05 and res["ci"][1] <= 0.3 and res["flagged"].sum() <= 0.05 * 164


def test_a_clear_card_pins_the_share_even_off_its_scale():
    """Members 4 sds above: a shift of the target's scores cannot pass for members."""
    rng = np.random.default_rng(12)
    y = np.r_[np.ones(82), np.zeros(82)].astype(int)
    s = np.r_[rng.normal(4, 1, 82), rng.normal(0, 1, 82)]
    member = rng.random(164) < 0.25
    target = np.where(member, rng.normal(4, 1, 164), rng.normal(0, 1, 164)) - 0.5  # the target's scale: lower
    res = card_estimate(target, y, s, np.full(164, 0.3), 0.5, fdr=0.1, n_boot=200, max_width=0.3)
    assert res["usable"], res.get("why_unusable")
    assert abs(res["estimate"] - member.mean()) <= 0.1 and res["ci"][0] <= member.mean() <= res["ci"][1]
    assert res["mixture"]["shifted"]["delta"] == pytest.approx(-0.5, abs=0.5)


def test_mixture_weight_is_exact_on_a_noiseless_mixture_and_undefined_without_separation():
    s0, s1 = np.linspace(-1, 1, 200), np.linspace(4, 6, 200)
    t = np.r_[np.linspace(-1, 1, 120), np.linspace(4, 6, 40)]
    assert card_route.mixture_weight(t, s0, s1) == pytest.approx(0.25, abs=0.01)
    assert card_route.mixture_weight(t, s0, s0) is None
    rng = np.random.default_rng(0)
    res = card_route.mixture_estimate(t, np.r_[np.zeros(200), np.ones(200)].astype(int), np.r_[s0, s1], seed=1)
    assert res["ci"][0] <= 0.25 <= res["ci"][1] and res["ci"][1] - res["ci"][0] < 0.2  # 160 tasks: binomial noise


def _collection(tgt_sol, ref_sol, tgt_prompt, ref_prompt):
    import pyarrow as pa

    from leakray.schema import C

    n = len(tgt_sol)
    cols = {C.TASK_ID: [f"t/{i}" for i in range(n)], C.PROMPT: ["def f():\n"] * n,
            C.REFERENCE: ["def f():\n    return 1\n"] * n, C.NOTES: [[] for _ in range(n)],
            C.REF_TOKEN_LOGPROBS: tgt_sol, C.REFMODEL_TOKEN_LOGPROBS: ref_sol}
    if tgt_prompt is not None:
        cols.update({C.PROMPT_LOGPROB: tgt_prompt, C.REFMODEL_PROMPT_LOGPROB: ref_prompt})
    return pa.table(cols)


def test_self_calibrated_statistic_reads_prompt_and_solution_and_says_which():
    table = _collection([[-1.0, -2.0], [-1.0]], [[-2.0, -2.0], [-1.5]], [-3.0, None], [-6.0, -1.0])
    got = selfcal.likelihood_ratio(table)
    from leakray.data.tasks import continuation

    sol = len(continuation("def f():\n", "def f():\n    return 1\n"))
    chars = sol + len("def f():\n")
    assert got["s"][0] == pytest.approx((1.0 + 3.0) / chars) and "prompt and solution" in got["statistic"]
    # what `net_of_difficulty` reads: the reference model's own likelihood of the same text, its length
    assert got["ref"][0] == pytest.approx((-2.0 - 2.0 - 6.0) / chars) and got["chars"][0] == chars
    assert np.isnan(got["s"][1]) and "for the prompt" in got["why"][1]
    solution_only = selfcal.likelihood_ratio(table, text="solution")
    assert solution_only["s"][1] == pytest.approx(0.5 / sol)
    old = selfcal.likelihood_ratio(_collection([[-1.0]], [[-1.5]], None, None))  # collected before the columns
    assert old["s"][0] == pytest.approx(0.5 / sol) and "of the solution" in old["statistic"]


def test_a_fine_tunes_spill_over_onto_short_tasks_is_taken_out_before_flagging():
    """A fine-tune on a fifth of HumanEval raises every HumanEval prompt's likelihood by a fixed amount
    on the format the tasks share, i.e. by B / chars per character: short clean tasks sit in the
    null's right tail (measured on the matrix's twins: rank correlation of s with the length over
    their clean tasks -0.43 to -0.46), and the flags' false-discovery rate went over `audit.fdr`
    (0.11-0.18 against 0.10). Net of the length and the reference model's likelihood it holds; the
    share is unchanged. 20 synthetic targets: 164 tasks, 33 members, spill-over 60 / chars."""
    fdr = {"raw": [], "net": []}
    for seed in range(20):
        rng = np.random.default_rng(seed)
        chars, ref = np.exp(rng.normal(6.3, 0.45, 164)), rng.normal(-1.0, 0.2, 164)
        member = np.zeros(164, bool)
        member[rng.choice(164, 33, replace=False)] = True
        s = 60 / chars + rng.normal(0, 0.06, 164) + 0.6 * member
        for name, x in (("raw", s), ("net", selfcal.net_of_difficulty(s, ref, chars)[0])):
            res = selfcal.estimate_empirical(*_lr(x), n_boot=50)
            flagged = res["per_task"]["flagged"]
            assert res["usable"] and abs(res["estimate"] - 33 / 164) <= 0.05 and flagged[member].all()
            fdr[name].append((flagged & ~member).sum() / flagged.sum())
    # measured: 0.141 raw, 0.096 net of difficulty. The raw side's bar sits below its measurement
    # (0.12, still over the promised 0.10) so that a library's rounding cannot fail it; the net side
    # keeps the promise with its own margin
    assert np.mean(fdr["net"]) <= 0.11 and np.mean(fdr["raw"]) >= 0.12
    assert np.mean(fdr["raw"]) - np.mean(fdr["net"]) >= 0.03


def test_net_of_difficulty_leaves_tasks_without_a_statistic_out_and_reports_its_fit():
    rng = np.random.default_rng(3)
    chars, ref = np.exp(rng.normal(6.3, 0.45, 60)), rng.normal(-1.0, 0.2, 60)
    s = -0.5 * ref + 0.1 * np.log(chars) + rng.normal(0, 0.01, 60)
    s[4], ref[7] = np.nan, np.nan
    out, fit = selfcal.net_of_difficulty(s, ref, chars)
    assert np.isnan(out[4]) and np.isnan(out[7]) and np.isfinite(np.delete(out, [4, 7])).all()
    assert fit["coef"] == pytest.approx([-0.5, 0.1], abs=0.02) and fit["n"] == 58
    assert np.nanstd(out) < 0.02  # nothing left but the noise


def test_the_audit_report_takes_the_difficulty_out_unless_told_not_to():
    from types import SimpleNamespace

    from leakray.report.audit import self_calibrated

    rng = np.random.default_rng(9)
    n = 40
    tgt, ref = rng.normal(-1.0, 0.3, (n, 3)), rng.normal(-1.2, 0.3, (n, 3))
    table = _collection(tgt.tolist(), ref.tolist(), rng.normal(-5, 1, n).tolist(), rng.normal(-6, 1, n).tolist())
    a = SimpleNamespace(fdr=0.1, bootstrap=50, shadow_seed=0, max_width=0.3, net_of_difficulty=True)
    net = self_calibrated(table, a)
    assert net["adjustment"]["n"] == n and "net of the task's difficulty" in net["statistic"]
    raw = self_calibrated(table, SimpleNamespace(**{**vars(a), "net_of_difficulty": False}))
    assert raw["adjustment"] is None and "net of" not in raw["statistic"]
    assert not np.allclose(net["per_task"]["s"], raw["per_task"]["s"])
