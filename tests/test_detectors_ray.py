import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pytest
import torch

from cgmia_data import synthetic_collection
from conftest import local_ray
from leakray.detect.baselines import detectleak_scores
from leakray.detect.cgmia import CGMIAConfig, arrays_from_table, fit_thresholded
from leakray.errors import BadInput
from leakray.evaluate.thresholds import choose_threshold
from leakray.protocols.detectors import (
    BASELINE_SEED,
    CGMIA,
    SCORES_SCHEMA,
    evaluate_detectors,
    scores_to_dict,
)
from leakray.executor.detector_train import train_cgmia_seeds_on_ray
from leakray.schema import S

torch.set_num_threads(1)

FAST = CGMIAConfig(epochs=8, expert_proj_dim=128, hidden=(64, 32), lr=1e-3, batch_size=32)


def test_evaluate_detectors_plain():
    shadow = synthetic_collection(n=120, seed=1)
    target = synthetic_collection(n=100, seed=2, prefix="u")
    res = evaluate_detectors(shadow, target, FAST, seeds=[0, 1, 2], bootstrap=200)
    assert res["seeds"] == [0, 1, 2] and len(res["per_seed"][CGMIA]) == 3
    assert set(res["median"]) == {CGMIA, "detectleak", "ref_loss", "gt_match"}
    assert res["median"][CGMIA]["auc"] > 0.85
    aucs = [m["auc"] for m in res["per_seed"][CGMIA]]
    assert res["median"][CGMIA]["auc"] == pytest.approx(np.median(aucs))
    med = res["median"][CGMIA]
    assert med["n_neg"] == 50 and med["n_degenerate"] == 0 and med["auc_ci"][0] <= med["auc"] <= med["auc_ci"][1]
    assert res["threshold_rule"] == "shadow_max_mcc" and res["bootstrap"] == {"n_resamples": 200, "seed": 0,
                                                                                "groups_drawn_whole": 0}
    th = res["thresholds"]
    assert len(th[CGMIA]["values"]) == 3 and "out-of-fold" in th[CGMIA]["chosen_on"]
    assert th["detectleak"]["chosen_on"] == "shadow" and len(th["detectleak"]["values"]) == 1
    t = res["scores"]
    assert t.schema == SCORES_SCHEMA and t.num_rows == 100 * (3 + 3)
    base = t.filter(t.column(S.DETECTOR).to_numpy(zero_copy_only=False) == "detectleak")
    assert set(base.column(S.SEED).to_pylist()) == {BASELINE_SEED}
    # the baseline's decisions are its target scores at the cut chosen on its shadow scores
    cut = choose_threshold(shadow.column("member").to_numpy(), detectleak_scores(shadow)).value
    assert th["detectleak"]["values"] == [cut]
    np.testing.assert_array_equal(base.column(S.PREDICTION).to_numpy(),
                                  (detectleak_scores(target) >= cut).astype(np.int8))
    # same seed, same scores and cut as a direct fit_thresholded
    det = fit_thresholded(arrays_from_table(shadow), FAST, seed=1)
    rows = t.filter(np.asarray([(d == CGMIA and s == 1) for d, s in zip(
        t.column(S.DETECTOR).to_pylist(), t.column(S.SEED).to_pylist())]))
    np.testing.assert_allclose(rows.column(S.SCORE).to_numpy(), det.predict_log_odds(arrays_from_table(target)))
    assert res["per_seed"][CGMIA][1]["threshold"] == det.threshold
    json.dumps(scores_to_dict(res))  # metrics.json must serialise


def _relabel(table, member):
    return table.set_column(table.schema.get_field_index("member"), "member", pa.array(member, pa.int8()))


def test_decisions_never_depend_on_the_target_labels():
    shadow = synthetic_collection(n=120, seed=1)
    target = synthetic_collection(n=100, seed=2, prefix="u", member_share=0.1)
    rng = np.random.default_rng(0)
    other = _relabel(target, rng.permutation(target.column("member").to_numpy()))
    runs = [evaluate_detectors(shadow, t, FAST, seeds=[0], bootstrap=0) for t in (target, other)]
    assert runs[0]["thresholds"] == runs[1]["thresholds"]
    np.testing.assert_array_equal(runs[0]["scores"].column(S.PREDICTION).to_numpy(),
                                  runs[1]["scores"].column(S.PREDICTION).to_numpy())


def test_shadow_fpr_rule_holds_on_a_target_with_ten_percent_members():
    # 20 members in 200: a top-half split would call 100 rows members (FPR >= 0.44). The
    # target's FPR only estimates the shadow's 5% (200 shadow non-members set the cut).
    shadow = synthetic_collection(n=400, seed=1)
    target = synthetic_collection(n=200, seed=2, prefix="u", member_share=0.1)
    res = evaluate_detectors(shadow, target, FAST, seeds=[0, 1], threshold_rule="shadow_fpr:0.05", bootstrap=0)
    for name, per_seed in res["per_seed"].items():
        for m in per_seed:
            assert m["threshold"]["rule"] == "shadow_fpr:0.05" and m["threshold"]["fpr"] <= 0.05
            assert m["n_pos"] == 20 and m["fp"] / m["n_neg"] < 0.2, name
            assert (m["tp"] + m["fp"]) / m["n"] < 0.3, name


def test_train_cgmia_on_ray_is_one_seed_of_the_seeds_run(monkeypatch):
    import leakray.executor.detector_train as mod

    seen = {}

    def fake(table, config, seeds, num_workers=1, storage_path=None, run_name=None):
        seen.update(seeds=seeds, storage_path=storage_path, run_name=run_name)
        return ["det"]

    monkeypatch.setattr(mod, "train_cgmia_seeds_on_ray", fake)
    assert mod.train_cgmia_on_ray(None, FAST, seed=9, storage_path="/s", run_name="r") == "det"
    assert seen == {"seeds": [9], "storage_path": "/s", "run_name": "r"}


def test_evaluate_refuses_overlap_unlabelled_and_bad_rule():
    shadow = synthetic_collection(n=40, seed=1)
    with pytest.raises(BadInput, match="both shadow and target"):
        evaluate_detectors(shadow, synthetic_collection(n=40, seed=2), FAST, seeds=[0])
    target = _relabel(synthetic_collection(n=40, seed=2, prefix="u"), [-1] * 40)
    with pytest.raises(BadInput, match="target collection needs member"):
        evaluate_detectors(shadow, target, FAST, seeds=[0])
    with pytest.raises(BadInput, match="threshold rule"):
        evaluate_detectors(shadow, synthetic_collection(n=40, seed=2, prefix="u"), FAST, seeds=[0],
                           threshold_rule="target_max_mcc")


@pytest.mark.slow
def test_evaluate_detectors_on_ray_train(tmp_path):
    # The real Ray Train path (no mocks): one TorchTrainer run trains both seeds and
    # cross-fits their thresholds; it must reproduce the in-process evaluation exactly.
    shadow = synthetic_collection(n=80, seed=1)
    target = synthetic_collection(n=60, seed=2, prefix="u")
    cfg = CGMIAConfig(epochs=3, expert_proj_dim=64, hidden=(32,), lr=1e-3, batch_size=32)
    with local_ray(num_cpus=1):
        on_ray = evaluate_detectors(shadow, target, cfg, seeds=[5, 6], use_ray_train=True,
                                    storage_path=tmp_path / "ray", detectors=[CGMIA], bootstrap=100)
        with pytest.raises(BadInput):
            train_cgmia_seeds_on_ray(shadow, cfg, seeds=[5], num_workers=2)
    local = evaluate_detectors(shadow, target, cfg, seeds=[5, 6], detectors=[CGMIA], bootstrap=100)
    assert len(list((tmp_path / "ray").iterdir())) == 1  # the one run directory
    np.testing.assert_allclose(on_ray["scores"].column(S.SCORE).to_numpy(),
                               local["scores"].column(S.SCORE).to_numpy(), atol=1e-6)
    np.testing.assert_allclose(on_ray["thresholds"][CGMIA]["values"], local["thresholds"][CGMIA]["values"],
                               atol=1e-6)
    assert on_ray["per_seed"][CGMIA][0]["threshold"]["chosen_on"] == local["per_seed"][CGMIA][0]["threshold"][
        "chosen_on"]
    for key in ("auc", "mcc", "tpr_at_5fpr", "n_degenerate"):
        assert on_ray["median"][CGMIA][key] == pytest.approx(local["median"][CGMIA][key]), key
    # the two seeds are two different detectors
    s5, s6 = (on_ray["scores"].filter(pa.compute.equal(on_ray["scores"].column(S.SEED), seed))
              .column(S.SCORE).to_numpy() for seed in (5, 6))
    assert not np.allclose(s5, s6)
