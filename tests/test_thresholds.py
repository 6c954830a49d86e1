import numpy as np
import pytest

from leakray.errors import BadInput
from leakray.evaluate.thresholds import apply_threshold, choose_threshold, mcc_from_counts, parse_rule

#            members score high, but one non-member (0.7) outscores two members
Y = np.array([1, 1, 0, 1, 1, 0, 0, 0])
S = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])


def test_parse_rule():
    assert parse_rule("shadow_max_mcc") == ("shadow_max_mcc", None)
    assert parse_rule("shadow_fpr:0.05") == ("shadow_fpr", 0.05)
    for bad in ("max_mcc", "shadow_fpr", "shadow_fpr:x", "shadow_fpr:1.5", "target_max_mcc"):
        with pytest.raises(BadInput, match="threshold rule"):
            parse_rule(bad)


def test_max_mcc_hand_computed():
    # cuts below 0.9, 0.8, 0.7, 0.6, 0.5: (tp, fp) = (1,0) (2,0) (2,1) (3,1) (4,1);
    # MCC of (4 tp, 1 fp, 3 tn, 0 fn) = 12 / sqrt(5*4*3*4) = 0.7746 is the largest
    th = choose_threshold(Y, S, "shadow_max_mcc")
    assert th.value == pytest.approx(0.45)  # halfway between 0.5 (in) and 0.4 (out)
    assert th.mcc == pytest.approx(12 / np.sqrt(5 * 4 * 3 * 4))
    assert (th.tpr, th.fpr, th.n_pos, th.n_neg) == (1.0, 0.25, 4, 4)
    np.testing.assert_array_equal(apply_threshold(S, th), [1, 1, 1, 1, 1, 0, 0, 0])


def test_fpr_rule_hand_computed():
    # no false positive allowed: the cut sits between 0.8 and 0.7 (TPR 0.5)
    th = choose_threshold(Y, S, "shadow_fpr:0.05")
    assert th.value == pytest.approx(0.75) and (th.tpr, th.fpr) == (0.5, 0.0)
    # one false positive of four allowed: the largest TPR with FPR <= 0.25 is 1.0
    th = choose_threshold(Y, S, "shadow_fpr:0.25")
    assert th.value == pytest.approx(0.45) and (th.tpr, th.fpr) == (1.0, 0.25)
    # the top scorer is a non-member: even FPR 0 means calling nobody a member
    th = choose_threshold([0, 1, 0], [3.0, 2.0, 1.0], "shadow_fpr:0.0")
    assert th.value > 3.0 and th.tpr == 0.0 and apply_threshold([3.0, 2.0, 1.0], th).sum() == 0
    # everything a member when that is best for MCC is impossible (MCC 0); all allowed by FPR 1
    th = choose_threshold([0, 1, 0], [3.0, 2.0, 1.0], "shadow_fpr:1")
    assert th.tpr == 1.0 and apply_threshold([3.0, 2.0, 1.0], th).tolist() == [1, 1, 0]


def test_ties_and_refusals():
    th = choose_threshold([1, 1, 0, 0, 0], [1.0, 1.0, 1.0, 0.0, 0.0])  # tied scores move together
    assert th.value == pytest.approx(0.5) and th.mcc == pytest.approx(4 / 6) and th.fpr == pytest.approx(1 / 3)
    # no cut beats MCC 0: the highest one (nobody a member) wins the tie
    th = choose_threshold([1, 0, 1, 0], [1.0, 1.0, 0.0, 0.0])
    assert th.value > 1.0 and th.mcc == 0.0 and th.tpr == 0.0
    with pytest.raises(BadInput, match="one class"):
        choose_threshold([1, 1], [0.2, 0.3])
    with pytest.raises(BadInput, match="row 1"):
        choose_threshold([1, 0], [0.2, float("nan")])


def test_mcc_from_counts_zero_on_empty_margin():
    np.testing.assert_allclose(mcc_from_counts([3, 0, 5], [1, 0, 5], [3, 5, 0], [1, 5, 0]), [0.5, 0.0, 0.0])


def test_threshold_from_shadow_fits_a_target_with_ten_percent_members():
    # Same score distributions on shadow (half members) and target (10% members). A
    # rank split or any rule that looks at the target would call half the target members.
    rng = np.random.default_rng(0)
    y_shadow = np.repeat([1, 0], 200)
    s_shadow = rng.normal(2.0 * y_shadow, 1.0)
    y_target = (np.arange(400) < 40).astype(int)
    s_target = rng.normal(2.0 * y_target, 1.0)
    th = choose_threshold(y_shadow, s_shadow, "shadow_max_mcc")
    assert 0.6 < th.value < 1.4  # the shadow's best cut for two unit normals 2 apart is ~1
    pred = apply_threshold(s_target, th)
    assert 0.1 < pred.mean() < 0.3  # a top-half split would give 0.5
    precision_at_cut = y_target[pred == 1].mean()
    top_half = np.argsort(-s_target)[:200]
    assert precision_at_cut > y_target[top_half].mean() + 0.15
    # at a shadow FPR bound of 5% the target's FPR stays near 5% too
    th5 = choose_threshold(y_shadow, s_shadow, "shadow_fpr:0.05")
    assert th5.fpr <= 0.05
    assert apply_threshold(s_target[y_target == 0], th5).mean() < 0.1


def test_a_rule_is_a_typed_value_parsed_once_and_written_as_its_text():
    import json
    import pickle

    from leakray.config import SimulateConfig
    from leakray.evaluate.thresholds import ThresholdRule

    rule = SimulateConfig(detect={"threshold_rule": "shadow_fpr:0.05"}).detect.threshold_rule
    assert isinstance(rule, ThresholdRule) and (rule.kind, rule.fpr) == ("shadow_fpr", 0.05)
    assert ThresholdRule(rule) is rule  # passed on, never parsed again
    assert json.dumps({"rule": rule}) == '{"rule": "shadow_fpr:0.05"}'
    back = pickle.loads(pickle.dumps(rule))  # crosses to Ray workers
    assert isinstance(back, ThresholdRule) and back.fpr == 0.05
    with pytest.raises(BadInput, match="FPR bound"):
        ThresholdRule("shadow_fpr:2")
