import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cgmia_data import synthetic_collection
from leakray.detect.cgmia import CGMIAConfig, CGMIADetector, arrays_from_table, fit
from leakray.errors import BadInput

torch.set_num_threads(1)

FAST = dict(epochs=15, expert_proj_dim=256, hidden=(128, 64), lr=1e-3, batch_size=32)


@pytest.fixture(scope="module")
def data():
    shadow = arrays_from_table(synthetic_collection(seed=1))
    target = arrays_from_table(synthetic_collection(seed=2, prefix="u"))
    return shadow, target


@pytest.fixture(scope="module")
def trained(data):
    return fit(data[0], CGMIAConfig(**FAST), seed=7, progress=False)


def test_arrays_from_table_shapes(data):
    a = data[0]
    assert a["gen"].shape == (160, 5, 16) and a["ref"].shape == (160, 16)
    assert a["expert"].shape == (160, 20) and a["member"].dtype == np.int8
    np.testing.assert_allclose(a["gen"][3, 2], np.asarray(
        synthetic_collection(seed=1).column("gen_embedding")[3].as_py(), np.float32).reshape(5, 16)[2])


def test_learns_planted_signal(data, trained):
    shadow, target = data
    p = trained.predict_proba(target)
    assert p.shape == (160,) and np.all((p >= 0) & (p <= 1))
    auc = roc_auc_score(target["member"], p)
    assert auc > 0.9
    # the signal is spread over features: combining them beats the best single one
    from leakray.detect.baselines import detectleak_scores
    assert auc > roc_auc_score(target["member"], detectleak_scores(synthetic_collection(seed=2))["score"])
    assert trained.history[-1]["loss"] < trained.history[0]["loss"]


def test_no_signal_no_skill():
    # same generator without the planted signal: the detector must not find one
    a = arrays_from_table(synthetic_collection(seed=3, signal=0.0))
    b = arrays_from_table(synthetic_collection(seed=4, signal=0.0))
    det = fit(a, CGMIAConfig(**FAST), seed=0, progress=False)
    assert abs(roc_auc_score(b["member"], det.predict_proba(b)) - 0.5) < 0.15


def test_scaler_fit_on_training_rows_only(data, trained):
    shadow, target = data
    np.testing.assert_allclose(trained.scaler_mean, shadow["expert"].astype(float).mean(0))
    np.testing.assert_allclose(trained.scaler_scale, shadow["expert"].astype(float).std(0))
    both = np.concatenate([shadow["expert"], target["expert"]]).mean(0)
    assert not np.allclose(trained.scaler_mean, both)
    before = trained.scaler_mean.copy()
    trained.predict_proba(target)  # predicting never refits
    np.testing.assert_array_equal(trained.scaler_mean, before)


def _frozen(det):
    return {k: v.clone() for k, v in det.frozen.state_dict().items()}


def test_frozen_weights_seeded():
    cfg = CGMIAConfig(**FAST)
    args = (16, 20, np.ones(20, bool), np.zeros(20), np.ones(20))
    a, b, c = (CGMIADetector(cfg, s, 5, *args) for s in (3, 3, 4))
    fa, fb, fc = _frozen(a), _frozen(b), _frozen(c)
    assert fa.keys() == fb.keys() and {"conv.0.weight", "conv.2.weight", "expert.weight"} <= fa.keys()
    assert all(torch.equal(fa[k], fb[k]) for k in fa)
    assert not any(torch.equal(fa[k], fc[k]) for k in fa if k.endswith("weight"))
    # the caller's RNG is untouched
    torch.manual_seed(0)
    x = torch.rand(1)
    torch.manual_seed(0)
    CGMIADetector(cfg, 3, 5, *args)
    assert torch.equal(torch.rand(1), x)
    assert not any(p.requires_grad for p in a.frozen.parameters())


def test_fit_deterministic_and_frozen_untouched_by_training(data, trained):
    shadow, target = data
    again = fit(shadow, CGMIAConfig(**FAST), seed=7, progress=False)
    np.testing.assert_array_equal(again.predict_proba(target), trained.predict_proba(target))
    fresh = CGMIADetector(CGMIAConfig(**FAST), 7, 5, 16, 20, trained.expert_keep,
                          trained.scaler_mean, trained.scaler_scale)
    assert all(torch.equal(v, fresh.frozen.state_dict()[k]) for k, v in trained.frozen.state_dict().items())


def test_save_load_roundtrip(tmp_path, data, trained):
    _, target = data
    trained.save(tmp_path / "det")
    loaded = CGMIADetector.load(tmp_path / "det")
    np.testing.assert_array_equal(loaded.predict_proba(target), trained.predict_proba(target))
    assert loaded.seed == 7 and loaded.config == trained.config
    assert all(torch.equal(v, loaded.frozen.state_dict()[k]) for k, v in trained.frozen.state_dict().items())
    with pytest.raises(BadInput):
        CGMIADetector.load(tmp_path / "nowhere")


def test_constant_pass_block_dropped_and_target_with_tests_ok():
    shadow = arrays_from_table(synthetic_collection(seed=5, has_tests=False))
    target = arrays_from_table(synthetic_collection(seed=6))
    det = fit(shadow, CGMIAConfig(**FAST), seed=0, progress=False)
    assert det.expert_keep.tolist() == [True] * 15 + [False] * 5
    p = det.predict_proba(target)
    assert np.all(np.isfinite(p)) and roc_auc_score(target["member"], p) > 0.85


@pytest.mark.parametrize("flags", [dict(use_expert=False), dict(use_gen=False, use_ref=False),
                                   dict(use_ref=False, use_expert=False)])
def test_ablations(data, flags):
    shadow, target = data
    det = fit(shadow, CGMIAConfig(**{**FAST, "epochs": 3}, **flags), seed=0, progress=False)
    assert det.predict_proba(target).shape == (160,)


def test_bad_input(data):
    shadow, target = data
    bad = dict(shadow, member=np.where(np.arange(160) == 5, -1, shadow["member"]).astype(np.int8))
    with pytest.raises(BadInput, match="row 5"):
        fit(bad, CGMIAConfig(**FAST), seed=0, progress=False)
    with pytest.raises(BadInput, match="one class"):
        fit(dict(shadow, member=np.zeros(160, np.int8)), CGMIAConfig(**FAST), seed=0, progress=False)
    with pytest.raises(BadInput):
        CGMIAConfig(use_ref=False, use_gen=False, use_expert=False)
    det = fit(shadow, CGMIAConfig(**{**FAST, "epochs": 1}), seed=0, progress=False)
    with pytest.raises(BadInput, match="trained on"):
        det.predict_proba(dict(target, ref=target["ref"][:, :8], gen=target["gen"][:, :, :8]))
