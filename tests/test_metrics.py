import math

import numpy as np
import pytest

from leakray.errors import BadInput
from leakray.evaluate.metrics import binary_metrics, downsample, median_over_repeats, tpr_at_fpr

Y = [1, 0, 1, 1, 0, 0, 1, 0]
S = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
P = [1, 1, 1, 1, 0, 0, 0, 0]


def test_hand_computed():
    m = binary_metrics(Y, S, P)
    assert (m["tp"], m["fp"], m["tn"], m["fn"]) == (3, 1, 3, 1)
    assert m["precision"] == m["recall"] == m["accuracy"] == m["f1"] == 0.75
    assert m["mcc"] == pytest.approx((3 * 3 - 1 * 1) / 16)
    assert m["auc"] == pytest.approx(11 / 16)  # pairs where a member outscores a non-member
    assert m["tpr_at_1fpr"] == pytest.approx(0.25)  # (0,.25) -> (.25,.25) is flat
    assert m["roc_curve"]["fpr"][0] == 0.0 and m["roc_curve"]["tpr"][-1] == 1.0
    assert m["pr_curve"]["recall"][0] == 1.0
    assert m["reasons"] == {}


def test_tpr_at_fpr_convention():
    fpr = [0, 0, 0.1, 0.1, 1]
    tpr = [0, 0.3, 0.3, 0.6, 1]
    assert tpr_at_fpr(fpr, tpr, 0.1) == pytest.approx(0.6)  # top of the vertical segment
    assert tpr_at_fpr(fpr, tpr, 0.05) == pytest.approx(0.3)
    assert tpr_at_fpr(fpr, tpr, 0.5) == pytest.approx(0.6 + 0.4 * 0.4 / 0.9)
    # all scores tied: the diagonal, i.e. a random tie-break
    m = binary_metrics([1, 0, 1, 0], [0.5] * 4, [1, 1, 0, 0])
    assert m["tpr_at_5fpr"] == pytest.approx(0.05) and m["auc"] == 0.5


def test_degenerate_one_class_is_nan_with_reason():
    m = binary_metrics([1, 1, 1], [0.1, 0.2, 0.3], [0, 0, 1])
    assert math.isnan(m["auc"]) and math.isnan(m["mcc"]) and math.isnan(m["tpr_at_1fpr"])
    assert "one class" in m["reasons"]["auc"]
    m = binary_metrics([1, 0], [0.1, 0.2], [0, 0])
    assert math.isnan(m["precision"]) and "no predicted positives" in m["reasons"]["precision"]
    with pytest.raises(BadInput):
        binary_metrics([1, 2], [0.1, 0.2], [0, 1])
    with pytest.raises(BadInput):
        binary_metrics([1, 0], [0.1, float("nan")], [0, 1])


def test_curves_downsampled():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 2000)
    s = rng.normal(size=2000) + y
    m = binary_metrics(y, s, (s > 0.5).astype(int))
    assert len(m["roc_curve"]["fpr"]) <= 101 and len(m["pr_curve"]["recall"]) <= 101
    assert m["roc_curve"]["fpr"][-1] == 1.0
    assert downsample(([1, 2, 3],))[0] == [1, 2, 3]


def test_median_over_repeats():
    reps = [{"auc": 0.5, "mcc": float("nan"), "roc_curve": {}}, {"auc": 0.7, "mcc": 0.2},
            {"auc": 0.9, "mcc": 0.4}]
    s = median_over_repeats(reps)
    assert s["auc"] == 0.7 and s["auc_min"] == 0.5 and s["auc_max"] == 0.9
    assert s["mcc"] == pytest.approx(0.3) and s["n_nan"] == {"mcc": 1}
    assert "roc_curve" not in s and s["n_repeats"] == 3
