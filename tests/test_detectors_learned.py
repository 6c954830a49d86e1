"""Learned and composite detectors (no Ray): each on a shadow/target pair where its input
carries the membership signal by construction, a shuffled-label control, thresholds from
held-out shadow rows only, save/load."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cgmia_data import rich_collection
from leakray.detect import registry
from leakray.detect.cgmia import CGMIAConfig
from leakray.schema import C

torch.set_num_threads(1)
FAST_CGMIA = CGMIAConfig(epochs=8, expert_proj_dim=64, hidden=(32,), lr=1e-3, batch_size=32).to_dict()


def _lexical(table: pa.Table) -> pa.Table:
    """Members' completions and references carry tokens non-members' never do: the token
    content the sequence models read separates them."""
    member = table.column(C.MEMBER).to_pylist()
    comps = [[c + ("    cache = memo(key)\n" if m else "") for c in cs]
             for cs, m in zip(table.column(C.COMPLETIONS).to_pylist(), member)]
    i = table.schema.get_field_index(C.COMPLETIONS)
    return table.set_column(i, table.schema.field(i), pa.array(comps, table.schema.field(i).type))


CASES = {  # name: (params, how to plant its signal)
    "gotcha": ({"hidden": [32], "max_iter": 100}, {"embed_shift": 3.0}),
    "codemi": ({}, {}),
    "cnn": ({"epochs": 6}, "lexical"),
    "lstm": ({"epochs": 6}, "lexical"),
    "transformer": ({"epochs": 6}, "lexical"),
    "cgmia_ensemble": ({"config": FAST_CGMIA, "members": 2}, {}),
    "leakray_combined": ({}, {"signal": 0.4}),
}


def _shuffled(table: pa.Table, seed: int) -> pa.Table:
    perm = np.random.default_rng(seed).permutation(table.column(C.MEMBER).to_numpy())
    i = table.schema.get_field_index(C.MEMBER)
    return table.set_column(i, table.schema.field(i), pa.array(perm, pa.int8()))


def _pair(plant, shuffle=False):
    """Signal planted first, then (for the control) the labels permuted: features kept, link broken."""
    kw = plant if isinstance(plant, dict) else {}
    sh, tg = rich_collection(n=120, seed=1, **kw), rich_collection(n=120, seed=2, prefix="u", **kw)
    if plant == "lexical":
        sh, tg = _lexical(sh), _lexical(tg)
    return (_shuffled(sh, 5), _shuffled(tg, 6)) if shuffle else (sh, tg)


OUT_OF_FOLD = ("cgmia_ensemble", "leakray_combined")  # thresholds on cross-fitted scores, not a split
SLOW = ("cnn", "lstm", "transformer")  # ~15 s each on a loaded 2-core machine


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CASES])
def test_learned_detector_learns_its_signal_and_not_shuffled_labels(name, tmp_path):
    params, plant = CASES[name]
    sh, tg = _pair(plant)
    y = tg.column(C.MEMBER).to_numpy()
    det = registry.make(name, params).fit(sh, seed=3)
    score = det.score(tg)
    assert score.shape == (120,) and np.isfinite(score).all()
    assert roc_auc_score(y, score) > 0.85, name
    th = det.threshold(sh)
    assert th["chosen_on"].startswith("shadow, ") and th["chosen_on"] != "shadow", th  # held-out rows only
    n_rows = th["n_pos"] + th["n_neg"]
    if name in OUT_OF_FOLD:  # every shadow row, each scored by a model that did not train on it
        assert "out-of-fold" in th["chosen_on"] and n_rows == 120, th
    else:  # the validation split only: the rows the detector did not train on
        assert "validation split" in th["chosen_on"] and n_rows == det.info["n_val"] < 120, (th, det.info)
    back = registry.load(det.save(tmp_path / name))
    np.testing.assert_allclose(back.score(tg), score, rtol=1e-6, atol=1e-9)
    assert back.threshold_ == th

    sh0, tg0 = _pair(plant, shuffle=True)
    control = registry.make(name, params).fit(sh0, seed=3).score(tg0)
    assert abs(roc_auc_score(tg0.column(C.MEMBER).to_numpy(), control) - 0.5) < 0.17, name


def test_same_seed_same_scores():
    sh, tg = _pair("lexical")
    a, b = (registry.make("cnn", {"epochs": 2}).fit(sh, seed=4).score(tg) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, registry.make("cnn", {"epochs": 2}).fit(sh, seed=5).score(tg))


def test_combined_groups_are_switchable_and_recorded():
    sh, tg = _pair({"signal": 0.4})
    det = registry.make("leakray_combined", {"groups": ["expert", "likelihood", "advprompt"]}).fit(sh, 0)
    assert set(det.info["groups_used"]) == {"expert", "likelihood"}
    assert det.info["groups_missing"] == ["advprompt"]
    assert det.info["groups_used"]["likelihood"] == ["ref_loss", "min_k", "min_k_pp", "zlib", "ref_calibrated",
                                                      "ref_calibrated_text"]
    assert det.info["n_features"] == 12 + 6
    # a target without a column the detector was fitted on is refused, not silently changed
    with pytest.raises(Exception, match="ref_token_logprobs|likelihood"):
        det.score(tg.drop_columns([C.REF_TOKEN_LOGPROBS]))


def _signal_in_the_prompt_only(table: pa.Table) -> pa.Table:
    """The solution's log-probabilities replaced by the reference model's (no membership left in
    them): only the prompt's log-probability still carries the planted signal."""
    i = table.schema.get_field_index(C.REF_TOKEN_LOGPROBS)
    return table.set_column(i, table.schema.field(i), table.column(C.REFMODEL_TOKEN_LOGPROBS))


def test_combined_reads_the_prompt_and_solution_ratio():
    # a leak seen in the docstring more than in the solution (a pretraining mixture's case): the
    # composite's likelihood group must carry ref_calibrated_text, not only solution-level scores
    sh, tg = (_signal_in_the_prompt_only(t) for t in _pair({"signal": 0.6}))
    y = tg.column(C.MEMBER).to_numpy()
    solution_only = registry.make("ref_calibrated").score(tg)
    assert abs(roc_auc_score(y, solution_only) - 0.5) < 0.15  # the control: the ratio over the solution
    det = registry.make("leakray_combined", {"groups": ["likelihood"]}).fit(sh, 0)
    assert "ref_calibrated_text" in det.info["groups_used"]["likelihood"]
    # without it the group read 0.71 here (ref_loss 0.71 and zlib 0.70 alone), with it 1.0
    assert roc_auc_score(y, det.score(tg)) > 0.9


def test_cgmia_ensemble_weights_follow_heldout_mcc():
    sh, _ = _pair({})
    det = registry.make("cgmia_ensemble", {"config": FAST_CGMIA, "members": 3}).fit(sh, 0)
    w, mcc = np.asarray(det.info["weights"]), np.clip(det.info["member_heldout_mcc"], 0, None)
    assert "different seeds" in det.info["members_from"] and len(w) == 3
    np.testing.assert_allclose(w, mcc / mcc.sum())


def test_cgmia_ensemble_beside_cgmia_reuses_its_fits_and_equals_a_fit_of_its_own():
    """Fitted as one group, the ensemble of seed s is made of CGMIA's seeds s, s+1 (fitted once
    each: 3 seeds for two detectors at seeds 0 and 1), and gives what the ensemble fitted on its
    own gives."""
    from leakray.detect.base import FitContext
    from leakray.detect.cgmia import CGMIA

    sh, tg = _pair({})
    params = {"cgmia": {"config": FAST_CGMIA}, "cgmia_ensemble": {"config": FAST_CGMIA, "members": 2}}
    fitted = CGMIA.fit_group(["cgmia", "cgmia_ensemble"], sh, [0, 1], params, FitContext())
    cg, ens = fitted["cgmia"], fitted["cgmia_ensemble"]
    assert [d.seed for d in cg] == [0, 1] and [e.info["member_seeds"] for e in ens] == [[0, 1], [1, 2]]
    assert ens[0].models[0] is cg[0].model and ens[0].models[1] is cg[1].model is ens[1].models[0]
    alone = registry.make("cgmia_ensemble", params["cgmia_ensemble"]).fit(sh, 1)
    np.testing.assert_allclose(alone.score(tg), ens[1].score(tg), atol=1e-6)
    np.testing.assert_allclose(alone.heldout(sh)[1], ens[1].heldout(sh)[1], atol=1e-6)
    assert alone.info["weights"] == pytest.approx(ens[1].info["weights"])
    # the group's CGMIA detectors are CGMIA's own: the same scores and cut as fitted alone
    own = registry.detector_class("cgmia").fit_seeds(sh, [1], params["cgmia"], FitContext())[0]
    np.testing.assert_allclose(own.score(tg), cg[1].score(tg), atol=1e-6)
    assert own.threshold_["value"] == pytest.approx(cg[1].threshold_["value"])


def test_cgmia_expert_blocks_mask_reaches_the_model():
    from leakray.detect.cgmia import arrays_from_table, fit

    sh, _ = _pair({})
    arrays = arrays_from_table(sh)
    k = arrays["expert"].shape[1] // 4
    det = fit(arrays, CGMIAConfig.from_dict({**FAST_CGMIA, "expert_blocks": [True, False, False, True]}), 0,
              progress=False)
    assert det.expert_keep[k:3 * k].sum() == 0 and det.expert_keep[:k].all()
    none = fit(arrays, CGMIAConfig.from_dict({**FAST_CGMIA, "expert_blocks": [False] * 4}), 0, progress=False)
    assert none.frozen.expert is None and not none.expert_keep.any()


def test_the_classic_mlp_scores_by_its_log_odds_which_do_not_tie_where_its_probability_does():
    """scikit-learn's MLP (`mlp`) saturates like CGMIA's and AdvPrompt's heads: its probability is
    exactly 1.0 past a margin of ~37, and those rows tie. Its score is the output unit before the
    logistic, from the public weights: the same model (its logistic is the probability), no ties."""
    from scipy.special import expit

    from leakray.detect.expert_ml import make_model, model_scores

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4))
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).astype(int)
    model = make_model("mlp", {"hidden_layer_sizes": [32, 16], "alpha": 1e-6}, seed=0).fit(x, y)
    far = x * 60  # far outside the training range: margins in the hundreds
    score, proba = model_scores(model, far), model.predict_proba(far)[:, 1]
    np.testing.assert_allclose(expit(score), proba, atol=1e-12)
    tied = proba == 1.0
    assert tied.sum() >= 20 and len(np.unique(score[tied])) == tied.sum()
    assert np.all(np.diff(proba[np.argsort(score)]) >= 0)
    lr = make_model("lr", {"C": 1.0}, seed=0).fit(x, y)  # the others keep their probability
    np.testing.assert_array_equal(model_scores(lr, x), lr.predict_proba(x)[:, 1])
