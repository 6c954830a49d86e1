import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cgmia_data import synthetic_collection
from leakray.detect.cgmia import (
    CGMIAConfig,
    CGMIADetector,
    arrays_from_table,
    cross_fit_log_odds,
    fit,
    fit_thresholded,
)
from leakray.evaluate.thresholds import choose_threshold
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
    assert auc > roc_auc_score(target["member"], detectleak_scores(synthetic_collection(seed=2)))
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
    # trained on a GPU (a Ray Train worker's), loaded where there is none (the driver on a CPU
    # head, a laptop reusing a card): it scores on the CPU, the same numbers
    if not torch.cuda.is_available():
        on_gpu = CGMIADetector.from_state({**trained.state(), "config": {**trained.config.to_dict(), "device": "cuda"}})
        assert on_gpu.config.device == "cpu"
        np.testing.assert_array_equal(on_gpu.predict_proba(target), trained.predict_proba(target))
        assert CGMIADetector.load(tmp_path / "det", device="cuda:0").config.device == "cpu"


def test_constant_pass_block_dropped_and_target_with_tests_ok():
    shadow = arrays_from_table(synthetic_collection(seed=5, has_tests=False))
    target = arrays_from_table(synthetic_collection(seed=6))
    det = fit(shadow, CGMIAConfig(**FAST), seed=0, progress=False)
    assert det.expert_keep.tolist() == [True] * 15 + [False] * 5
    p = det.predict_proba(target)
    assert np.all(np.isfinite(p)) and roc_auc_score(target["member"], p) > 0.85


def _auc(det, arrays):
    return roc_auc_score(arrays["member"], det.predict_proba(arrays))


def test_ablation_changes_what_the_model_sees(data):
    shadow, _ = data
    det = fit(shadow, CGMIAConfig(**{**FAST, "epochs": 1}, use_gen=False, use_expert=False), seed=0, progress=False)
    # only the reference embedding reaches the head, unchanged
    np.testing.assert_allclose(det.features(shadow).numpy(), shadow["ref"], rtol=1e-6)
    widths = {name: fit(shadow, CGMIAConfig(**{**FAST, "epochs": 1}, **flags), seed=0,
                        progress=False).frozen.out_dim
              for name, flags in (("all", {}), ("no_expert", dict(use_expert=False)),
                                  ("expert_only", dict(use_ref=False, use_gen=False)))}
    assert widths == {"all": 16 + 16 + 256, "no_expert": 32, "expert_only": 256}


def test_ablating_the_only_informative_block_collapses_auc():
    # membership planted in the expert features only: without them the detector is at chance
    expert_only = dict(signal=0.5, embed_signal=0.0)
    a = arrays_from_table(synthetic_collection(seed=11, **expert_only))
    b = arrays_from_table(synthetic_collection(seed=12, prefix="u", **expert_only))
    assert _auc(fit(a, CGMIAConfig(**FAST), seed=0, progress=False), b) > 0.85
    assert abs(_auc(fit(a, CGMIAConfig(**FAST, use_expert=False), seed=0, progress=False), b) - 0.5) < 0.15
    # and the converse: membership only in the embeddings, the expert block alone is at chance
    embed_only = dict(signal=0.0, embed_shift=3.0)
    a = arrays_from_table(synthetic_collection(seed=13, **embed_only))
    b = arrays_from_table(synthetic_collection(seed=14, prefix="u", **embed_only))
    assert _auc(fit(a, CGMIAConfig(**FAST, use_expert=False), seed=0, progress=False), b) > 0.85
    assert abs(_auc(fit(a, CGMIAConfig(**FAST, use_ref=False, use_gen=False), seed=0, progress=False), b)
               - 0.5) < 0.15


def test_threshold_chosen_out_of_fold_on_training_rows_only(data):
    shadow, target = data
    det = fit_thresholded(shadow, CGMIAConfig(**FAST), seed=7, rule="shadow_max_mcc")
    th = det.threshold
    assert th["rule"] == "shadow_max_mcc" and "out-of-fold" in th["chosen_on"]
    assert (th["n_pos"], th["n_neg"]) == (80, 80)
    # the cut is the rule applied to the cross-fitted log-odds (the score: a probability saturates),
    # which differ from the final detector's (overfit) scores on its own training rows
    oof = cross_fit_log_odds(shadow, CGMIAConfig(**FAST), seed=7)
    assert th["value"] == choose_threshold(shadow["member"], oof, "shadow_max_mcc").value
    assert not np.allclose(oof, det.predict_log_odds(shadow), atol=1e-3)
    np.testing.assert_allclose(det.predict_proba(target), 1 / (1 + np.exp(-det.predict_log_odds(target))))
    # the final detector is plain fit's, and predict() uses the stored cut
    np.testing.assert_array_equal(det.predict_proba(target), fit(shadow, CGMIAConfig(**FAST), seed=7,
                                                                 progress=False).predict_proba(target))
    np.testing.assert_array_equal(det.predict(target), (det.predict_log_odds(target) >= th["value"]).astype(np.int8))
    # cross-fitting is seeded and never looks at rows outside the training arrays
    np.testing.assert_array_equal(oof, cross_fit_log_odds(shadow, CGMIAConfig(**FAST), seed=7))
    with pytest.raises(BadInput, match="no decision threshold"):
        fit(shadow, CGMIAConfig(**{**FAST, "epochs": 1}), seed=0, progress=False).predict(target)
    # a shadow too small for 4 folds gets as many as its smaller class allows, and says so
    members, others = np.flatnonzero(shadow["member"] == 1), np.flatnonzero(shadow["member"] == 0)
    six = {k: v[np.r_[members[:3], others[:3]]] for k, v in shadow.items()}
    small = fit_thresholded(six, CGMIAConfig(**{**FAST, "epochs": 2}), seed=0)
    assert "3-fold" in small.threshold["chosen_on"]
    one_member = {k: v[np.r_[members[:1], others[:3]]] for k, v in shadow.items()}
    with pytest.raises(BadInput, match="cross-fit"):
        fit_thresholded(one_member, CGMIAConfig(**FAST), seed=0)
    with pytest.raises(BadInput, match="cross-fit"):
        cross_fit_log_odds(six, CGMIAConfig(**FAST), seed=0, n_folds=4)


def test_threshold_saved_with_the_detector(tmp_path, data):
    shadow, target = data
    det = fit_thresholded(shadow, CGMIAConfig(**{**FAST, "epochs": 3}), seed=1, rule="shadow_fpr:0.05")
    det.save(tmp_path / "d")
    loaded = CGMIADetector.load(tmp_path / "d")
    assert loaded.threshold == det.threshold and loaded.threshold["fpr"] <= 0.05
    np.testing.assert_array_equal(loaded.predict(target), det.predict(target))


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
