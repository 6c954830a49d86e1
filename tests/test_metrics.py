import math

import numpy as np
import pytest

from leakray.errors import BadInput
from leakray.evaluate.metrics import (
    _auc_batched,
    _tpr_at_fpr_batched,
    binary_metrics,
    bootstrap_interval,
    column_auc,
    downsample,
    median_over_repeats,
    tpr_at_fpr,
)

Y = [1, 0, 1, 1, 0, 0, 1, 0]
S = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
P = [1, 1, 1, 1, 0, 0, 0, 0]


def test_hand_computed():
    m = binary_metrics(Y, S, P)
    assert (m["tp"], m["fp"], m["tn"], m["fn"]) == (3, 1, 3, 1)
    assert m["precision"] == m["recall"] == m["accuracy"] == m["f1"] == 0.75
    assert m["mcc"] == pytest.approx((3 * 3 - 1 * 1) / 16)
    assert m["auc"] == pytest.approx(11 / 16)  # pairs where a member outscores a non-member
    assert m["tpr_at_1fpr"] == m["tpr_at_5fpr"] == pytest.approx(0.25)  # the 0.9 member before any non-member
    assert m["n_neg"] == 4 and m["min_nonzero_fpr"] == 0.25
    assert m["roc_curve"]["fpr"][0] == 0.0 and m["roc_curve"]["tpr"][-1] == 1.0
    assert m["pr_curve"]["recall"][0] == 1.0
    assert m["reasons"] == {} and m["degenerate"] is False
    lo, hi = m["auc_ci"]
    assert lo <= m["auc"] <= hi and len(m["tpr_at_5fpr_ci"]) == 2


def test_tpr_at_fpr_conservative_step():
    fpr = [0, 0, 0.1, 0.1, 0.5, 1]
    tpr = [0, 0.3, 0.3, 0.6, 0.7, 1]
    assert tpr_at_fpr(fpr, tpr, 0.1) == pytest.approx(0.6)  # top of the vertical segment
    assert tpr_at_fpr(fpr, tpr, 0.05) == pytest.approx(0.3)  # no interpolation towards (0.1, 0.6)
    assert tpr_at_fpr(fpr, tpr, 0.4) == pytest.approx(0.6)  # interpolation would say 0.675
    assert tpr_at_fpr(fpr, tpr, 0.5) == pytest.approx(0.7)
    # all scores tied: the only vertices are (0, 0) and (1, 1); nothing is reached at 5% FPR
    m = binary_metrics([1, 0, 1, 0], [0.5] * 4, [1, 1, 0, 0])
    assert m["tpr_at_5fpr"] == 0.0 and m["auc"] == 0.5


def test_tpr_at_fpr_few_negatives_hand_computed():
    # 20 non-members: 5% FPR allows exactly one false positive, 1% allows none
    y = [1] * 4 + [0] * 20
    s = [10, 8, 6, 0.5] + [9, 7] + [0.0] * 18
    m = binary_metrics(y, s, [0] * 24)
    assert m["n_neg"] == 20 and m["min_nonzero_fpr"] == pytest.approx(0.05)
    assert m["tpr_at_1fpr"] == pytest.approx(0.25)  # only the 10 beats every non-member
    assert m["tpr_at_5fpr"] == pytest.approx(0.5)  # 10 and 8 pass, with 9 as the one false positive
    # the vectorised statistic the bootstrap uses agrees with the ROC reading
    pos, neg = np.array(s[:4], float), np.array(s[4:], float)
    assert _tpr_at_fpr_batched(pos[None], neg[None], 0.05)[0] == pytest.approx(0.5)
    assert _tpr_at_fpr_batched(pos[None], neg[None], 0.01)[0] == pytest.approx(0.25)


def test_batched_statistics_match_sklearn():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.normal(size=300) + y, 1)  # rounded: many ties
    m = binary_metrics(y, s, (s > 0).astype(int), n_bootstrap=0)
    pos, neg = s[y == 1][None], s[y == 0][None]
    assert _auc_batched(pos, neg)[0] == pytest.approx(m["auc"])
    for a, key in ((0.01, "tpr_at_1fpr"), (0.05, "tpr_at_5fpr")):
        assert _tpr_at_fpr_batched(pos, neg, a)[0] == pytest.approx(m[key])
    assert all(math.isnan(v) for v in m["auc_ci"]) and "switched off" in m["reasons"]["auc_ci"]


def test_column_auc_is_sklearns_auc_of_each_column():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    for n in (5, 37, 120):
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]
        x = np.stack([rng.normal(size=n) + y, np.round(rng.normal(size=n), 0), np.full(n, 2.5), -y,
                      rng.integers(0, 3, n)], axis=1)  # signal, heavy ties, constant, perfect (reversed), ties
        want = [roc_auc_score(y, x[:, j]) for j in range(x.shape[1])]
        np.testing.assert_allclose(column_auc(y, x), want, rtol=0, atol=1e-12)
    assert column_auc([0, 1, 1], np.array([[3.0], [1.0], [2.0]]))[0] == 0.0
    with pytest.raises(BadInput, match="both classes"):
        column_auc([1, 1], np.ones((2, 3)))


def test_bootstrap_interval_seeded_contains_estimate_and_narrows():
    rng = np.random.default_rng(2)

    def sample(n):
        y = np.repeat([1, 0], n // 2)
        return y, rng.normal(y * 1.0, 1.0)

    y, s = sample(100)
    a = binary_metrics(y, s, (s > 0.5).astype(int), bootstrap_seed=3)
    b = binary_metrics(y, s, (s > 0.5).astype(int), bootstrap_seed=3)
    c = binary_metrics(y, s, (s > 0.5).astype(int), bootstrap_seed=4)
    assert a["auc_ci"] == b["auc_ci"] and a["tpr_at_5fpr_ci"] == b["tpr_at_5fpr_ci"]
    assert a["auc_ci"] != c["auc_ci"]
    assert a["auc_ci"][0] < a["auc"] < a["auc_ci"][1]
    assert a["tpr_at_5fpr_ci"][0] <= a["tpr_at_5fpr"] <= a["tpr_at_5fpr_ci"][1]
    y2, s2 = sample(2000)
    big = binary_metrics(y2, s2, (s2 > 0.5).astype(int))
    width = lambda m, k: m[k][1] - m[k][0]  # noqa: E731
    assert width(big, "auc_ci") < width(a, "auc_ci") / 3  # ~1/sqrt(20)
    assert width(big, "tpr_at_5fpr_ci") < width(a, "tpr_at_5fpr_ci") / 2


def test_bootstrap_auc_interval_covers_the_true_auc():
    # members ~ N(1, 1), non-members ~ N(0, 1): true AUC = Phi(1 / sqrt 2) = 0.7602
    from scipy.stats import norm

    true_auc = norm.cdf(1 / np.sqrt(2))
    rng = np.random.default_rng(5)
    hits = 0
    for i in range(60):
        pos, neg = rng.normal(1, 1, 40), rng.normal(0, 1, 40)
        lo, hi = bootstrap_interval(_auc_batched, pos, neg, n_resamples=300, seed=i)
        hits += lo <= true_auc <= hi
    assert 0.85 <= hits / 60 <= 1.0  # nominal 95%; a broken interval (or none) misses often


def test_degenerate_one_class_is_nan_with_reason():
    m = binary_metrics([1, 1, 1], [0.1, 0.2, 0.3], [0, 0, 1])
    assert math.isnan(m["auc"]) and math.isnan(m["tpr_at_1fpr"]) and all(math.isnan(v) for v in m["auc_ci"])
    assert "one class" in m["reasons"]["auc"]
    assert m["mcc"] == 0.0 and m["degenerate"] is True  # sklearn's convention, flagged
    with pytest.raises(BadInput):
        binary_metrics([1, 2], [0.1, 0.2], [0, 1])
    with pytest.raises(BadInput):
        binary_metrics([1, 0], [0.1, float("nan")], [0, 1])


def test_no_predicted_positive_is_mcc_zero_and_flagged():
    from sklearn.metrics import matthews_corrcoef

    m = binary_metrics([1, 0, 1, 0], [0.4, 0.1, 0.3, 0.2], [0, 0, 0, 0])
    assert m["mcc"] == 0.0 == matthews_corrcoef([1, 0, 1, 0], [0, 0, 0, 0])
    assert m["degenerate"] is True and "margin is empty" in m["reasons"]["mcc"]
    assert m["precision"] == 0.0 and "no predicted positives" in m["reasons"]["precision"]
    assert m["auc"] == 1.0  # ranking metrics are unaffected by the decisions
    m = binary_metrics([1, 0, 1, 0], [0.4, 0.1, 0.3, 0.2], [1, 1, 1, 1])  # everyone a member
    assert m["mcc"] == 0.0 and m["degenerate"] is True


def test_curves_downsampled():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 2000)
    s = rng.normal(size=2000) + y
    m = binary_metrics(y, s, (s > 0.5).astype(int))
    assert len(m["roc_curve"]["fpr"]) <= 101 and len(m["pr_curve"]["recall"]) <= 101
    assert m["roc_curve"]["fpr"][-1] == 1.0
    assert downsample(([1, 2, 3],))[0] == [1, 2, 3]


def test_median_over_repeats_keeps_every_seed():
    reps = [{"auc": 0.5, "mcc": 0.0, "degenerate": True, "auc_ci": [0.3, 0.7], "roc_curve": {}},
            {"auc": 0.7, "mcc": 0.2, "degenerate": False, "auc_ci": [0.5, 0.8]},
            {"auc": 0.9, "mcc": 0.4, "degenerate": False, "auc_ci": [0.8, 1.0]}]
    s = median_over_repeats(reps)
    assert s["auc"] == 0.7 and s["auc_min"] == 0.5 and s["auc_max"] == 0.9
    # the degenerate seed's MCC 0 is in the median (leaving it out would give 0.3)
    assert s["mcc"] == pytest.approx(0.2) and s["mcc_min"] == 0.0
    assert s["n_degenerate"] == 1 and s["n_repeats"] == 3 and s["n_nan"] == {}
    assert s["auc_ci"] == [0.5, 0.8]  # median lo, median hi
    assert "roc_curve" not in s and "degenerate" not in s
    # a field undefined in one seed is undefined in the median, and counted
    s = median_over_repeats([{"recall": float("nan")}, {"recall": 0.5}, {"recall": 0.7}])
    assert math.isnan(s["recall"]) and s["n_nan"] == {"recall": 1}


def test_degenerate_seeds_counted_from_real_metrics():
    y = [1, 0, 1, 0, 1, 0]
    s = [0.9, 0.2, 0.8, 0.3, 0.7, 0.1]
    reps = [binary_metrics(y, s, p, n_bootstrap=0) for p in
            ([1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0])]
    med = median_over_repeats(reps)
    assert med["n_degenerate"] == 1
    assert med["mcc"] == pytest.approx(reps[2]["mcc"])  # median of (1, 0, 0.577)
