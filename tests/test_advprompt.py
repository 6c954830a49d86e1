"""advprompt detector: the 27 features, missing variants, the MLP on synthetic members that are
separable by construction, a shuffled-label control, determinism, save/load, gray-box split."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from leakray.detect import advprompt as ap
from leakray.errors import BadInput

D = 16


def synthetic(n: int = 400, seed: int = 0, missing: float = 0.0) -> dict[str, np.ndarray]:
    """Members: completions stay near the reference under perturbation and their perplexity
    barely moves; non-members drift and their perplexity rises. Half of each."""
    rng = np.random.default_rng(seed)
    member = (np.arange(n) % 2).astype(np.int8)
    ref = rng.normal(size=(n, D))
    drift = np.where(member == 1, 0.3, 1.5)[:, None]
    base = ref + rng.normal(size=(n, D)) * drift * 0.5
    adv = ref[:, None, :] + rng.normal(size=(n, ap.N_VARIANTS, D)) * drift[:, :, None]
    base_ppl = rng.uniform(1.5, 4.0, size=n)
    rise = np.where(member == 1, 0.02, 0.4)[:, None]
    adv_ppl = base_ppl[:, None] * (1 + np.abs(rng.normal(size=(n, ap.N_VARIANTS))) * rise)
    mask = rng.random((n, ap.N_VARIANTS)) >= missing
    return {"ref": ref, "base": base, "adv": adv, "base_ppl": base_ppl, "adv_ppl": adv_ppl, "adv_mask": mask,
            "member": member, "task_id": np.array([f"t{i}" for i in range(n)], dtype=object)}


FAST = ap.AdvPromptConfig(epochs=10, batch_size=16)


def test_feature_names_and_values():
    assert ap.N_FEATURES == 27 and len(ap.FEATURE_NAMES) == 27
    assert ap.FEATURE_NAMES[1] == "sim_IDC1" and ap.FEATURE_NAMES[-3] == "ppl_IDL3"
    a = synthetic(3)
    a["adv"][0] = a["ref"][0]  # identical to the reference: similarity 1
    a["adv_ppl"][0] = a["base_ppl"][0] * 1.5  # +50% perplexity
    x, present = ap.feature_matrix(a)
    assert x.shape == (3, 27) and present.all()
    assert np.allclose(x[0, 1:12], 1.0)
    assert np.allclose(x[0, 14:25], 0.5) and np.isclose(x[0, 25], 0.5) and np.isclose(x[0, 26], 0.0)
    cos = a["ref"][1] @ a["base"][1] / np.linalg.norm(a["ref"][1]) / np.linalg.norm(a["base"][1])
    assert np.isclose(x[1, 0], cos)
    assert np.isclose(x[1, 12], x[1, :12].mean()) and np.isclose(x[1, 13], x[1, :12].std())


def test_missing_variants_are_explicit_and_imputed_within_the_row():
    a = synthetic(4)
    a["adv_mask"][0, [2, 5]] = False
    a["adv_mask"][1, :] = False  # no variant at all
    a["adv_ppl"][0, 2] = np.nan  # a missing variant may carry anything
    x, present = ap.feature_matrix(a)
    assert np.isnan(x[0, 1 + 2]) and np.isnan(x[0, 14 + 5]) and not present[0, 2]
    keep = np.delete(np.arange(12), [3, 6])
    assert np.isclose(x[0, 12], x[0, keep].mean())  # mean over present entries only
    assert np.isclose(x[1, 12], x[1, 0]) and x[1, 25] == 0.0 and x[1, 26] == 0.0
    filled = ap.impute(x)
    assert np.isfinite(filled).all()
    assert np.isclose(filled[0, 3], x[0, 12]) and np.isclose(filled[0, 14 + 5], x[0, 25])
    assert np.allclose(filled[1, 14:25], 0.0)
    a["adv_ppl"][3, 0] = np.inf  # a present variant may not
    with pytest.raises(BadInput, match="adv_ppl"):
        ap.feature_matrix(a)


def test_bad_arrays_are_refused():
    a = synthetic(5)
    with pytest.raises(BadInput, match="adv"):
        ap.feature_matrix({**a, "adv": a["adv"][:, :10]})
    with pytest.raises(BadInput, match="base_ppl"):
        ap.feature_matrix({**a, "base_ppl": np.zeros(5)})
    with pytest.raises(BadInput, match="lack"):
        ap.feature_matrix({k: v for k, v in a.items() if k != "adv_mask"})
    with pytest.raises(BadInput):
        ap.AdvPromptConfig(drop_features=("nope",))
    with pytest.raises(BadInput, match="one class"):
        ap.fit({**a, "member": np.ones(5, np.int8)}, FAST)


def _graybox_auc(a, config=FAST, seed=0) -> float:
    train, test = ap.graybox_split(a["member"], 0.2, seed=seed)
    det = ap.fit(ap.take(a, train), config, seed=seed)
    return roc_auc_score(a["member"][test], det.predict_proba(ap.take(a, test)))


def test_separable_members_are_found_in_the_graybox_setting():
    assert _graybox_auc(synthetic(400, seed=1)) > 0.95


def test_separable_with_a_third_of_variants_missing():
    assert _graybox_auc(synthetic(400, seed=2, missing=0.33)) > 0.9


def test_shuffled_labels_give_chance():
    aucs = []
    for seed in range(3):
        a = synthetic(400, seed=10 + seed)
        a["member"] = np.random.default_rng(seed).permutation(a["member"])
        aucs.append(_graybox_auc(a, seed=seed))
    assert abs(np.mean(aucs) - 0.5) < 0.08, aucs


def test_paper_configuration_trains():
    """27 -> 3 x 512 (dropout) -> 2, batches of 4, 25 epochs, Adam 1e-3."""
    a = synthetic(200, seed=3)
    cfg = ap.AdvPromptConfig()
    assert cfg.hidden == (512, 512, 512) and cfg.batch_size == 4 and cfg.epochs == 25 and cfg.lr == 1e-3
    train, test = ap.graybox_split(a["member"], 0.2, seed=0)
    det = ap.fit(ap.take(a, train), cfg, seed=0)
    linears = [m for m in det.net if isinstance(m, ap.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(27, 512), (512, 512), (512, 512), (512, 2)]
    assert sum(isinstance(m, ap.nn.Dropout) for m in det.net) == 3
    assert len(det.history) == 25
    assert roc_auc_score(a["member"][test], det.predict_proba(ap.take(a, test))) > 0.9


def test_seeded_and_saved(tmp_path):
    a = synthetic(120, seed=4)
    p1 = ap.fit(a, FAST, seed=7).predict_proba(a)
    det = ap.fit(a, FAST, seed=7)
    assert np.array_equal(p1, det.predict_proba(a))
    assert not np.array_equal(p1, ap.fit(a, FAST, seed=8).predict_proba(a))  # another seed, another net
    loaded = ap.AdvPromptDetector.load(det.save(tmp_path / "det"))
    assert np.array_equal(loaded.predict_proba(a), p1)
    assert loaded.config == det.config and loaded.n_train == 120
    if not torch.cuda.is_available():  # trained on a GPU, scored where there is none: on the CPU
        elsewhere = ap.AdvPromptDetector.load(tmp_path / "det", device="cuda")
        assert elsewhere.config.device == "cpu" and np.array_equal(elsewhere.predict_proba(a), p1)
    with pytest.raises(BadInput):
        ap.AdvPromptDetector.load(tmp_path / "nothing")


def test_scores_are_log_odds_that_keep_the_order_a_saturated_probability_loses():
    """Trained to near-zero loss (the paper's classifier on a few dozen rows, as in a detect
    stage), the member probability rounds to 1.0 on many rows; the log-odds it is made from
    does not, and ranks those rows. The registry detector scores and thresholds by it."""
    a = synthetic(400, seed=6)
    train, test = ap.graybox_split(a["member"], 0.2, seed=0)
    det = ap.fit(ap.take(a, train), ap.AdvPromptConfig(), seed=0)
    held = ap.take(a, test)
    z, p = det.predict_log_odds(held), det.predict_proba(held)
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-z)))  # the same model, two scales
    softmax32 = torch.softmax(torch.stack([torch.zeros(len(z)), torch.as_tensor(z, dtype=torch.float32)], 1), 1)[:, 1]
    tied = (softmax32 == 1.0).numpy()
    assert tied.sum() >= 10, z.max()  # saturated in float32, as the detectors' probabilities were
    assert len(np.unique(z[tied])) == tied.sum()  # and ordered by the log-odds
    assert np.all(np.diff(p[np.argsort(z)]) >= 0)  # the probability never contradicts that order


def test_ablations_and_mask_features_change_the_input():
    a = synthetic(120, seed=5, missing=0.2)
    kinds_dropped = tuple(n for n in ap.FEATURE_NAMES if n.endswith(("IDL1", "IDL2", "IDL3")))
    det = ap.fit(a, ap.AdvPromptConfig(epochs=2, drop_features=kinds_dropped, mask_features=True), seed=0)
    assert det.in_dim == 27 - 6 + 11
    assert det.inputs(a).shape == (120, 32)
    assert np.isfinite(det.predict_proba(a)).all()


def test_graybox_split_matches_the_paper():
    member = np.array([1] * 50 + [0] * 70 + [-1] * 5, dtype=np.int8)
    train, test = ap.graybox_split(member, 0.2, seed=0)
    assert len(set(train) & set(test)) == 0
    assert (member[train] == 1).sum() == 10 and (member[train] == 0).sum() == 10
    assert (member[test] == 1).sum() == 40 and (member[test] == 0).sum() == 40  # balanced like training
    assert (member[np.concatenate([train, test])] != -1).all()
    _, unbalanced = ap.graybox_split(member, 0.2, seed=0, balanced_test=False)
    assert (member[unbalanced] == 0).sum() == 60
    assert not np.array_equal(train, ap.graybox_split(member, 0.2, seed=1)[0])
    with pytest.raises(BadInput):
        ap.graybox_split(np.array([1, 0, 0]), 0.2)
