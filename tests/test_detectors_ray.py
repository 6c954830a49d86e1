import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from cgmia_data import synthetic_collection
from leakray.detect.cgmia import CGMIAConfig, arrays_from_table, fit
from leakray.errors import BadInput
from leakray.pipelines.detectors import BASELINE_SEED, CGMIA, SCORES_SCHEMA, evaluate_detectors
from leakray.schema import S

torch.set_num_threads(1)

FAST = CGMIAConfig(epochs=8, expert_proj_dim=128, hidden=(64, 32), lr=1e-3, batch_size=32)


def test_evaluate_detectors_plain():
    shadow = synthetic_collection(n=120, seed=1)
    target = synthetic_collection(n=100, seed=2, prefix="u")
    res = evaluate_detectors(shadow, target, FAST, seeds=[0, 1, 2])
    assert res["seeds"] == [0, 1, 2] and len(res["per_seed"][CGMIA]) == 3
    assert set(res["median"]) == {CGMIA, "detectleak", "ref_loss", "gt_match"}
    assert res["median"][CGMIA]["auc"] > 0.85
    aucs = [m["auc"] for m in res["per_seed"][CGMIA]]
    assert res["median"][CGMIA]["auc"] == pytest.approx(np.median(aucs))
    t = res["scores"]
    assert t.schema == SCORES_SCHEMA and t.num_rows == 100 * (3 + 3)
    base = t.filter(t.column(S.DETECTOR).to_numpy(zero_copy_only=False) == "detectleak")
    assert set(base.column(S.SEED).to_pylist()) == {BASELINE_SEED}
    # same seed, same scores as a direct fit
    det = fit(arrays_from_table(shadow), FAST, seed=1, progress=False)
    rows = t.filter(np.asarray([(d == CGMIA and s == 1) for d, s in zip(
        t.column(S.DETECTOR).to_pylist(), t.column(S.SEED).to_pylist())]))
    np.testing.assert_allclose(rows.column(S.SCORE).to_numpy(), det.predict_proba(arrays_from_table(target)))


def test_evaluate_with_ray_train_flag_routes_through_ray(monkeypatch):
    # the Ray run itself is covered by the slow test; here only the wiring (one Ray run costs ~25 s)
    import leakray.pipelines.detectors as mod

    calls = []

    def fake(table, config, seeds, storage_path=None):
        calls.append((seeds, storage_path))
        return [fit(arrays_from_table(table), config, seed, progress=False) for seed in seeds]

    monkeypatch.setattr(mod, "train_cgmia_seeds_on_ray", fake)
    shadow, target = synthetic_collection(n=60, seed=1), synthetic_collection(n=40, seed=2, prefix="u")
    res = evaluate_detectors(shadow, target, FAST, seeds=[3, 4], use_ray_train=True, storage_path="/x",
                             baselines=())
    assert calls == [([3, 4], "/x")] and set(res["per_seed"]) == {CGMIA}


def test_train_cgmia_on_ray_is_one_seed_of_the_seeds_run(monkeypatch):
    import leakray.pipelines.detectors as mod

    seen = {}

    def fake(table, config, seeds, num_workers=1, storage_path=None, run_name=None):
        seen.update(seeds=seeds, storage_path=storage_path, run_name=run_name)
        return ["det"]

    monkeypatch.setattr(mod, "train_cgmia_seeds_on_ray", fake)
    assert mod.train_cgmia_on_ray(None, FAST, seed=9, storage_path="/s", run_name="r") == "det"
    assert seen == {"seeds": [9], "storage_path": "/s", "run_name": "r"}


def test_evaluate_refuses_overlap_and_unlabelled():
    shadow = synthetic_collection(n=40, seed=1)
    with pytest.raises(BadInput, match="both shadow and target"):
        evaluate_detectors(shadow, synthetic_collection(n=40, seed=2), FAST, seeds=[0])
    import pyarrow as pa
    target = synthetic_collection(n=40, seed=2, prefix="u")
    target = target.set_column(target.schema.get_field_index("member"), "member",
                               pa.array([-1] * 40, pa.int8()))
    with pytest.raises(BadInput, match="target collection needs member"):
        evaluate_detectors(shadow, target, FAST, seeds=[0])


@pytest.mark.slow
def test_train_cgmia_on_ray(tmp_path):
    import ray

    from leakray.pipelines.detectors import train_cgmia_seeds_on_ray

    shadow = synthetic_collection(n=80, seed=1)
    target = arrays_from_table(synthetic_collection(n=60, seed=2, prefix="u"))
    cfg = CGMIAConfig(epochs=3, expert_proj_dim=64, hidden=(32,), lr=1e-3, batch_size=32)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        # one Ray Train run only: each run costs 25-60 s of start-up on a shared 2-core box
        two = train_cgmia_seeds_on_ray(shadow, cfg, seeds=[5, 6], storage_path=tmp_path / "ray")
        with pytest.raises(BadInput):
            train_cgmia_seeds_on_ray(shadow, cfg, seeds=[5], num_workers=2)
    finally:
        if started:
            ray.shutdown()
    local = fit(arrays_from_table(shadow), cfg, seed=5, progress=False)
    assert [d.seed for d in two] == [5, 6] and len(two[0].history) == 3
    # same seed, same data: the Ray run trains the very same detector
    np.testing.assert_allclose(two[0].predict_proba(target), local.predict_proba(target), atol=1e-6)
    assert len(list((tmp_path / "ray").iterdir())) == 1  # the run directory
    assert two[1].seed == 6 and not np.allclose(two[1].predict_proba(target), local.predict_proba(target))
