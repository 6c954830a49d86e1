"""Ray Tune really searches (several grid points per model, the chosen one the best on the
shadow's validation split, the target never seen), and evaluate_detectors end to end over
the registry: skipped detectors with reasons, costs, shadow-chosen thresholds."""

import json

import pandas as pd
import pyarrow as pa
import pytest
import torch
from sklearn.metrics import roc_auc_score

from cgmia_data import rich_collection
from conftest import local_ray
from leakray.detect import expert_ml
from leakray.detect.cgmia import CGMIAConfig
from leakray.schema import C, collection_schema

torch.set_num_threads(1)
pytestmark = pytest.mark.slow  # a local Ray and one Tune run per test


@pytest.fixture(scope="module")
def ray_local():
    with local_ray():
        yield


def test_tune_grid_searches_and_picks_the_best_on_shadow_validation(ray_local, tmp_path):
    shadow = rich_collection(n=120, seed=1, signal=0.5)
    target = rich_collection(n=120, seed=2, prefix="u", signal=0.5)
    grids = {"lr": {"grid": {"C": [1e-4, 1.0, 100.0]}}, "dt": {"grid": {"max_depth": [1, 3], "min_samples_leaf": [1]}},
             "rf": {"grid": {"n_estimators": [20], "max_depth": [2, None]}}}
    from leakray.executor.tune import tune_trials

    fitted = expert_ml.fit_kinds(shadow, ["lr", "dt", "rf"], [0, 1], grids, storage_path=tmp_path, trials=tune_trials)
    data = {"x": expert_ml.expert_means(shadow), "y": shadow.column(C.MEMBER).to_numpy(),
            "keys": expert_ml.task_keys(shadow), "val_share": expert_ml.VAL_SHARE}
    for kind, dets in fitted.items():
        for seed, det in zip([0, 1], dets):
            trials = det.info["trials"]
            assert len(trials) == det.info["n_configs"] > 1  # really a search
            assert {t["params"]["kind"] for t in trials} == {kind}
            # every reported validation AUC is what that grid point scores on this seed's shadow split
            for t in trials:
                assert t["val_auc"] == pytest.approx(expert_ml.fit_eval(t["params"], seed, data))
            best = max(t["val_auc"] for t in trials)
            assert det.info["val_auc"] == best
            chosen = [t for t in trials if t["val_auc"] == best][0]["params"]
            assert {**det.info["chosen"], "kind": kind} == chosen
            th = det.threshold(shadow)
            assert "validation split" in th["chosen_on"] and th["n_pos"] + th["n_neg"] < 120
            assert roc_auc_score(target.column(C.MEMBER).to_numpy(), det.score(target)) > 0.7
    assert len(list(tmp_path.iterdir())) == 1  # one Tune run for all three models and both seeds


def test_evaluate_detectors_over_the_registry(ray_local, tmp_path):
    from leakray.protocols.detectors import SCORES_SCHEMA, evaluate_detectors, scores_to_dict

    sch = collection_schema()
    shadow = rich_collection(n=120, seed=1, signal=0.5)
    target = rich_collection(n=100, seed=2, prefix="u", signal=0.5)
    # a backend that could not fill the reference-model column: all-null in both
    for name in ("shadow", "target"):
        t = locals()[name]
        i = t.schema.get_field_index(C.REFMODEL_TOKEN_LOGPROBS)
        t = t.set_column(i, sch.field(C.REFMODEL_TOKEN_LOGPROBS), pa.nulls(t.num_rows, sch.field(
            C.REFMODEL_TOKEN_LOGPROBS).type))
        if name == "shadow":
            shadow = t
        else:
            target = t
    names = ["cgmia", "min_k", "ref_calibrated", "cdd", "nb", "lr", "codemi"]
    res = evaluate_detectors(shadow, target, CGMIAConfig(epochs=8, expert_proj_dim=32, hidden=(16,), lr=1e-3,
                                                         batch_size=16),
                             seeds=[0, 1], detectors=names, bootstrap=0,
                             detector_params={"lr": {"grid": {"C": [0.1, 10.0]}}},
                             storage_path=tmp_path, save_dir=tmp_path / "saved", trace_memory=True)
    assert res["detectors"] == names
    assert res["skipped"]["ref_calibrated"].startswith("column 'refmodel_token_logprobs' is empty (its pass was "
                                                       "switched off")
    assert set(res["skipped"]) == {"ref_calibrated"}
    assert set(res["median"]) == set(names) - {"ref_calibrated"}
    assert set(res["costs"]) == set(res["median"])  # a cost per detector run, none for the skipped one
    for name in res["median"]:
        cost = res["costs"][name]
        # traced: every detector allocates something while it fits and scores
        assert cost["wall_s"] > 0 and cost["py_peak_mb"] > 0, (name, cost)
        assert isinstance(cost["peak_rss_mb"], float) and cost["peak_rss_mb"] >= 0, (name, cost)
        assert cost["peak_rss_how"] in ("high-water mark", "sampled"), (name, cost)
        assert res["median"][name]["auc"] > 0.6, name
    shared = lambda name: {k: v for k, v in res["costs"][name].items() if k != "trial_s"}  # noqa: E731
    assert shared("nb") == shared("lr")  # one shared Tune run, one measurement
    assert res["costs"]["nb"]["shared_run"] == ["nb", "lr"] and res["costs"]["lr"]["trial_s"] > 0
    # where the stage's time went: each group's fit, threshold, score and metrics, summed over the
    # groups; the Tune search's fit is its trials' own seconds, not its wall time here (mostly waiting)
    parts, groups = res["part_seconds"], ["cgmia", "min_k", "cdd", "lr", "codemi"]
    assert set(parts) == {"fit", "threshold", "score", "metrics"} and all(v > 0 for v in parts.values())
    assert res["costs"]["lr"]["part_seconds"]["fit"] == pytest.approx(
        res["costs"]["lr"]["trial_s"] + res["costs"]["nb"]["trial_s"], abs=0.02)
    assert res["costs"]["lr"]["part_seconds"]["fit"] < res["costs"]["lr"]["wall_s"]
    for part in parts:
        assert parts[part] == pytest.approx(sum(res["costs"][g]["part_seconds"].get(part, 0) for g in groups),
                                            abs=0.05)
    assert len(res["per_seed"]["min_k"]) == 1 and len(res["per_seed"]["lr"]) == 2
    assert res["thresholds"]["min_k"]["chosen_on"] == "shadow"
    assert "validation split" in res["thresholds"]["codemi"]["chosen_on"]
    assert "out-of-fold" in res["thresholds"]["cgmia"]["chosen_on"]
    assert res["details"]["lr"][0]["n_configs"] == 2
    t = res["scores"]
    assert t.schema == SCORES_SCHEMA and t.num_rows == 100 * (2 + 1 + 1 + 2 + 2 + 2)
    assert sorted(p.name for p in (tmp_path / "saved").iterdir())[:3] == ["cdd", "cgmia-seed0", "cgmia-seed1"]
    import json
    json.dumps(scores_to_dict(res))


def test_memory_is_measured_per_detector_and_sees_what_it_allocates(monkeypatch):
    """peak_rss_mb (always) and py_peak_mb (with trace_memory) are per detector: a detector that
    holds 8 MiB while fitting shows at least that, the detector after it does not inherit the
    peak, and without tracing py_peak_mb is None."""
    import time

    import numpy as np

    from leakray.detect.min_k import MinK
    from leakray.protocols.detectors import evaluate_detectors

    shadow, target = rich_collection(n=40, seed=1), rich_collection(n=40, seed=2, prefix="u")
    fit = MinK.fit

    def fat_fit(self, table, seed=0):
        block = np.ones(2**20)  # 8 MiB, traced by tracemalloc (numpy reports its buffers)
        # 8 MiB the process must take from the system: numpy's buffer may reuse pages the allocator
        # already holds (glibc serves a large block from its heap once one has been freed)
        pages = _resident_block(8 * 2**20)
        out = fit(self, table, seed)
        time.sleep(0.1)  # held across several of the resident-set sampler's 10 ms reads
        del block
        pages.close()
        return out

    monkeypatch.setattr(MinK, "fit", fat_fit)
    res = evaluate_detectors(shadow, target, seeds=[0], detectors=["min_k", "zlib"], bootstrap=0, trace_memory=True)
    costs = res["costs"]
    assert set(costs) == {"min_k", "zlib"}
    assert costs["min_k"]["py_peak_mb"] >= 8.0, costs
    assert 0 < costs["zlib"]["py_peak_mb"] < 8.0, costs  # its own peak, not min_k's
    assert costs["min_k"]["peak_rss_mb"] >= 7.5, costs  # pages, not bytes: a little under the array's size
    assert 0 <= costs["zlib"]["peak_rss_mb"] < 7.5, costs
    off = evaluate_detectors(shadow, target, seeds=[0], detectors=["min_k"], bootstrap=0)  # the default: untraced
    assert off["costs"]["min_k"]["py_peak_mb"] is None and off["costs"]["min_k"]["wall_s"] > 0
    assert off["costs"]["min_k"]["peak_rss_mb"] >= 7.5, off["costs"]


def _resident_block(size: int):
    """An anonymous mapping of ``size`` bytes, written: always new resident pages."""
    import mmap

    block = mmap.mmap(-1, size)
    block.write(b"\1" * size)
    return block


def test_resident_set_peak_sees_a_short_lived_block_and_only_its_growth():
    from leakray.protocols.rss_peak import RssPeak, resident_bytes

    assert resident_bytes() > 0
    with RssPeak() as held:
        block = _resident_block(32 * 2**20)
        import time

        time.sleep(0.05)
        block.close()
    with RssPeak() as idle:
        pass
    assert held.mb >= 30.0, held.mb
    assert idle.mb is not None and idle.mb < 30.0, idle.mb
    assert held.how == idle.how == "high-water mark"  # alone in the process: the kernel's mark, no thread


def test_the_high_water_mark_sees_a_peak_shorter_than_any_sampling_interval():
    """A block mapped and unmapped between two samples of a (slow) sampler: the sampler misses
    it, the kernel's mark does not; a block that starts while another is measured samples
    rather than resetting the other's mark, and the outer block still sees the inner one's peak."""
    import threading

    from leakray.protocols.rss_peak import RssPeak, reset_high_water

    if not reset_high_water():
        pytest.skip("this kernel does not let a process reset its peak resident set")
    with RssPeak(interval=60.0, use_mark=False) as sampled:
        _resident_block(48 * 2**20).close()
    with RssPeak(interval=60.0) as marked:
        _resident_block(48 * 2**20).close()
    assert sampled.how == "sampled" and sampled.mb < 24.0, sampled.mb
    assert marked.how == "high-water mark" and marked.mb >= 46.0, marked.mb

    inner_started, inner_may_end = threading.Event(), threading.Event()
    got = {}

    def inner():
        with RssPeak(interval=60.0) as peak:
            inner_started.set()
            inner_may_end.wait(10)
        got["inner"] = peak

    with RssPeak(interval=60.0) as outer:
        t = threading.Thread(target=inner)
        t.start()
        inner_started.wait(10)
        _resident_block(48 * 2**20).close()  # while both are measured
        inner_may_end.set()
        t.join()
    assert outer.how == "high-water mark" and outer.mb >= 46.0, outer.mb  # the inner block did not reset it
    assert got["inner"].how == "sampled"


def test_expert_ablation_covers_all_sixteen_subsets():
    from leakray.protocols.detectors import expert_subsets, run_expert_ablation

    masks = expert_subsets()
    assert len(set(masks)) == 16 and masks[0] == (True,) * 4 and masks[-1] == (False,) * 4
    shadow = rich_collection(n=60, seed=1)
    target = rich_collection(n=40, seed=2, prefix="u")
    out = run_expert_ablation(shadow, target, CGMIAConfig(epochs=2, expert_proj_dim=16, hidden=(8,), lr=1e-3),
                              seeds=[0], threshold_folds=2)
    assert len(out) == 16 and out[-1]["label"] == "none (semantic only)"
    assert [o["label"] for o in out if o["without_pass_only"]] == ["perplexity+codebleu+edit_distance"]
    assert all(0 <= o["median"]["auc"] <= 1 for o in out)


def test_detectors_side_by_side_as_ray_tasks_give_the_sequential_result(ray_local, tmp_path, monkeypatch):
    # a plug-in too: Ray's workers were started without $LEAKRAY_DETECTORS; the tasks get it
    from pathlib import Path

    from leakray.detect import registry
    from leakray.protocols.detectors import evaluate_detectors

    monkeypatch.setenv(registry.PLUGINS_ENV, f"toy={Path(__file__).parent / 'plugins' / 'toy_detector.py'}:Toy")
    registry.detector_class.cache_clear()
    shadow = rich_collection(n=80, seed=1, signal=0.5)
    target = rich_collection(n=60, seed=2, prefix="u", signal=0.5)
    names = ["min_k", "gt_match", "toy", "gotcha", "codemi"]
    kw = dict(seeds=[0, 1], detectors=names, bootstrap=50, trace_memory=False)
    from leakray.progress import JobTally

    tally = JobTally(tmp_path / "progress.json")
    try:
        side = evaluate_detectors(shadow, target, parallel=True, save_dir=tmp_path / "side", tally=tally, **kw)
        seq = evaluate_detectors(shadow, target, parallel=False, **kw)
    finally:
        registry.detector_class.cache_clear()
    # every job counted once as it finished: the two learned detectors' (gotcha, codemi) seeds a
    # Ray task each, the three that learn nothing one each
    assert tally.done == tally.total == 2 * 2 + 3
    assert json.loads((tmp_path / "progress.json").read_text()) == {"total": 7, "done": 7, "unit": "jobs",
                                                                      "pace": False}
    assert list(side["per_seed"]) == list(seq["per_seed"]) == names  # report order kept
    for name in names:
        assert [m["auc"] for m in side["per_seed"][name]] == [m["auc"] for m in seq["per_seed"][name]], name
        # torch in a Ray worker runs on one thread, the driver on several: float32 reductions
        # sum in another order, so the cuts agree to rounding, not to the last bit
        t_side, t_seq = side["thresholds"][name], seq["thresholds"][name]
        assert {k: v for k, v in t_side.items() if k != "values"} == {k: v for k, v in t_seq.items() if k != "values"}
        assert t_side.get("values") == pytest.approx(t_seq.get("values"), rel=1e-5, abs=1e-7), name
    pd.testing.assert_frame_equal(side["scores"].to_pandas(), seq["scores"].to_pandas(), check_exact=False, rtol=1e-5, atol=1e-7)
    assert (tmp_path / "side" / "toy" / "detector.json").exists()  # saved on the driver


def test_a_detectors_seed_tasks_merge_in_order_and_one_skipped_seed_skips_it():
    from types import SimpleNamespace as NS

    from leakray.protocols.detectors import _merge_seed_jobs

    def out(name, seed, wall, peak=1.0, how="high-water mark"):
        return {"members": [name], "rows": {name: [{"detector": NS(seed=seed)}]},
                "cost": {"wall_s": wall, "peak_rss_mb": peak, "peak_rss_how": how, "py_peak_mb": None,
                         "part_seconds": {"fit": wall - 0.25, "metrics": 0.25}}}

    merged = _merge_seed_jobs([out("gotcha", 3, 1.0), out("min_k", 0, 0.5),
                               out("gotcha", 1, 2.0, peak=4.0, how="sampled"),
                               {"members": ["cdd"], "skipped": "no column"}, out("cdd", 1, 1.0)])
    by = {o["members"][0]: o for o in merged}
    assert [r["detector"].seed for r in by["gotcha"]["rows"]["gotcha"]] == [3, 1]  # submission order
    # one seed task's peak was sampled: the merged peak is not exact
    assert by["gotcha"]["cost"] == {"wall_s": 3.0, "peak_rss_mb": 4.0, "py_peak_mb": None,
                                    "peak_rss_how": "sampled", "part_seconds": {"fit": 2.5, "metrics": 0.5}}
    assert by["cdd"] == {"members": ["cdd"], "skipped": "no column"}
    assert len(by["min_k"]["rows"]["min_k"]) == 1
