"""Registry API and the score-only detectors (likelihood family, generation-only): each on a
collection where its own signal separates members, a shuffled-label control, definitions
checked by hand, save/load, and skipping with a reason when a column is empty."""

import numpy as np
import pyarrow as pa
import pytest
from sklearn.metrics import roc_auc_score

from cgmia_data import rich_collection, synthetic_collection
from leakray.detect import registry
from leakray.detect.base import missing_input
from leakray.errors import BadInput
from leakray.schema import C, collection_schema

SCORE_ONLY = ["ref_loss", "min_k", "min_k_pp", "zlib", "ref_calibrated", "ref_calibrated_text", "detectleak", "gt_match", "cdd", "buzzer_b"]


@pytest.fixture(scope="module")
def target():
    return rich_collection(n=200, seed=2, prefix="u")


def _auc(table, name):
    return roc_auc_score(table.column(C.MEMBER).to_numpy(), registry.make(name).score(table))


def test_registry_lists_every_detector_with_a_valid_spec():
    names = registry.names()
    # the three memory probes and text_combined joined; then ref_calibrated against a non-oracle reference,
    # then over the prompt and the solution; then the sampled next-token probe (alone, and against
    # the oracle and the non-oracle reference models); then the same three over the prompt's cuts;
    # then AdvPrompt-MIA on its text-only features
    assert len(names) == len(set(names)) == 37
    schema_cols = set(collection_schema().names)
    for name in names:
        spec = registry.spec(name)
        assert spec.name == name and spec.paper and spec.summary
        assert set(spec.columns) <= schema_cols, name
        assert spec.learns == (spec.family in ("learned", "composite")), name
    assert registry.resolve("all") == names
    assert registry.resolve(["min_k", "cdd", "min_k"]) == ["min_k", "cdd"]
    with pytest.raises(BadInput, match="unknown detector 'min_kk'"):
        registry.resolve(["min_kk"])
    with pytest.raises(BadInput, match="unknown parameters"):
        registry.make("min_k", {"kk": 0.1})


@pytest.mark.parametrize("name", SCORE_ONLY)
def test_score_only_detector_finds_its_planted_signal_and_not_a_shuffled_one(name, target):
    assert _auc(target, name) > 0.75, name
    shuffled = rich_collection(n=200, seed=2, prefix="u", shuffle_labels=True)
    assert abs(_auc(shuffled, name) - 0.5) < 0.12, name
    # no signal planted: no skill either
    assert abs(_auc(rich_collection(n=200, seed=3, signal=0.0), name) - 0.5) < 0.15, name


def _lists(name, rows):
    return pa.table({name: pa.array(rows, collection_schema().field(name).type)})


def test_min_k_and_min_k_pp_definitions():
    lp = [[-1.0, -5.0, -0.1, -3.0, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7]]  # 10 tokens: lowest 20% = 2
    t = _lists(C.REF_TOKEN_LOGPROBS, lp)
    assert registry.make("min_k").score(t)[0] == pytest.approx(-4.0)
    assert registry.make("min_k", {"k": 0.05}).score(t)[0] == pytest.approx(-5.0)  # at least one token
    mu, sigma = [[-2.0] * 10], [[2.0] * 10]
    t = t.append_column(C.REF_TOKEN_MU, pa.array(mu, pa.list_(pa.float32()))).append_column(
        C.REF_TOKEN_SIGMA, pa.array(sigma, pa.list_(pa.float32())))
    assert registry.make("min_k_pp").score(t)[0] == pytest.approx(((-5 + 2) / 2 + (-3 + 2) / 2) / 2)
    bad = t.set_column(2, C.REF_TOKEN_SIGMA, pa.array([[0.0] * 10], pa.list_(pa.float32())))
    with pytest.raises(BadInput, match="row 0.*ref_token_sigma"):
        registry.make("min_k_pp").score(bad)


def test_zlib_ref_calibrated_cdd_buzzer_definitions():
    import zlib

    t = pa.table({C.REF_LOSS: pa.array([2.0], pa.float32()), C.PROMPT: ["def f():\n"],
                  C.REFERENCE: ["def f():\n    return 1\n"]})
    assert registry.make("zlib").score(t)[0] == pytest.approx(-2.0 / len(zlib.compress(b"\n    return 1\n")))
    t = _lists(C.REF_TOKEN_LOGPROBS, [[-1.0, -3.0]]).append_column(
        C.REFMODEL_TOKEN_LOGPROBS, pa.array([[-2.0, -4.0]], pa.list_(pa.float32())))
    assert registry.make("ref_calibrated").score(t)[0] == pytest.approx(1.0)
    # a reference model with another tokenizer (one token for the same text): the likelihood ratio
    # of the whole text per target token, (-4 - -2) / 2 = -1
    assert registry.make("ref_calibrated").score(t.set_column(1, C.REFMODEL_TOKEN_LOGPROBS,
                                                              pa.array([[-2.0]], pa.list_(pa.float32()))))[0] \
        == pytest.approx(-1.0)
    # the same statistic against simulate's second (non-oracle) reference model, read from its own column
    alt = t.append_column(C.REFALT_TOKEN_LOGPROBS, pa.array([[-1.0, -2.0, -3.0]], pa.list_(pa.float32())))
    assert registry.make("ref_calibrated_nonoracle").score(alt)[0] == pytest.approx((-4.0 + 6.0) / 2)
    with pytest.raises(BadInput, match="at least 1"):  # an unscored reference is an error, not a score
        registry.make("ref_calibrated").score(t.set_column(1, C.REFMODEL_TOKEN_LOGPROBS,
                                                           pa.array([[]], pa.list_(pa.float32()))))
    # 20 tokens per sample -> bound alpha*l = 1 edit: pairs (a,a) and (a,a') are close, (b, *) not
    a = "x = 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 0"
    assert len(__import__("leakray.features.expert", fromlist=["x"]).code_tokens(a)) == 21
    samples = [a, a, a.replace("9", "8"), "y = [i for i in range(10) if i % 2 == 0 and i > 3]"]
    t = pa.table({C.COMPLETIONS: [samples]})
    # pairs: 0-1 (0), 0-2 (1), 1-2 (1) close; three pairs with the last far: 3 of 6
    assert registry.make("cdd").score(t)[0] == pytest.approx(3 / 6)
    assert registry.make("cdd", {"alpha": 0.0}).score(t)[0] == pytest.approx(1 / 6)
    t = pa.table({C.PERPLEXITY: pa.array([[2.0, 8.0]], pa.list_(pa.float32())),
                  C.UPPER_PERPLEXITY: pa.array([[4.0, 16.0]], pa.list_(pa.float32()))})
    assert registry.make("buzzer_b").score(t)[0] == pytest.approx(np.log(2.0))


def test_missing_input_says_why():
    plain = synthetic_collection(n=10)  # no token-level columns at all
    assert "lacks column 'ref_token_logprobs'" in missing_input(plain, registry.spec("min_k").columns)
    sch = collection_schema()
    empty = plain.append_column(sch.field(C.REF_TOKEN_LOGPROBS), pa.nulls(10, sch.field(C.REF_TOKEN_LOGPROBS).type))
    # the main pass fills it: only a backend that gives no log-probabilities leaves it empty
    assert missing_input(empty, registry.spec("min_k").columns) == \
        "column 'ref_token_logprobs' is empty (the sampling backend could not fill it)"
    assert missing_input(plain, registry.spec("detectleak").columns) is None
    # an optional pass's column names the switch that turns it on
    for column, switch in ((C.REFALT_TOKEN_LOGPROBS, "columns.nonoracle_reference"),
                           (C.REFMODEL_NEXT_DRAWS, "columns.reference_model"), (C.UPPER_PERPLEXITY, "columns.upper_case"),
                           (C.ADV_EMBEDDING, "columns.advprompt"), (C.QUESTION_DRAWS, "columns.probes (question)")):
        off = plain.append_column(sch.field(column), pa.nulls(10, sch.field(column).type))
        assert f"is empty (its pass was switched off: {switch};" in missing_input(off, [column])


@pytest.mark.parametrize("name", ["min_k", "cdd"])
def test_save_load_keeps_params_and_threshold(name, target, tmp_path):
    det = registry.make(name, {"k": 0.1} if name == "min_k" else {"alpha": 0.1}).fit(target, -1)
    th = det.threshold(target)
    back = registry.load(det.save(tmp_path / name))
    assert type(back) is type(det) and back.params == det.params and back.threshold_ == th
    np.testing.assert_array_equal(back.score(target), det.score(target))


def test_a_detector_kept_outside_leakray_plugs_in_with_one_entry(monkeypatch, target):
    from pathlib import Path

    plugin = Path(__file__).parent / "plugins" / "toy_detector.py"
    monkeypatch.setenv(registry.PLUGINS_ENV, f"toy={plugin}:Toy")
    registry.detector_class.cache_clear()
    try:
        assert registry.names()[-1] == "toy" and registry.resolve("all")[-1] == "toy"
        assert registry.spec("toy").access == "black box"
        assert len(registry.make("toy").score(target)) == target.num_rows
        monkeypatch.setenv(registry.PLUGINS_ENV, "ref_loss=x.py:Y")
        with pytest.raises(BadInput, match="built-in"):
            registry.names()
        monkeypatch.setenv(registry.PLUGINS_ENV, "toy")
        with pytest.raises(BadInput, match="expected name=file.py:Class"):
            registry.names()
    finally:
        registry.detector_class.cache_clear()


def test_every_detector_declares_its_fit_and_the_protocol_chooses_where_it_runs(monkeypatch):
    from leakray.detect.base import FIT_KINDS
    from leakray.detect.cgmia import CGMIAConfig, arrays_from_table, fit_thresholded
    from leakray.protocols import detectors as proto

    fits = {name: registry.spec(name).fit for name in registry.names()}
    assert set(fits.values()) <= set(FIT_KINDS)
    assert fits["cgmia"] == "ray_train" and fits["lr"] == fits["mlp"] == "ray_tune" and fits["min_k"] == "none"
    assert all(registry.detector_class(n).group == "expert_ml" for n in ("lr", "rf", "svm", "nb", "dt", "mlp"))

    calls = []

    def fake_ray_train(shadow, config, seeds, *, storage_path, threshold_rule, threshold_folds):
        calls.append(seeds)  # the run the protocol lends; trains in-process here
        arrays = arrays_from_table(shadow)
        return [fit_thresholded(arrays, config, s, threshold_rule, threshold_folds) for s in seeds]

    monkeypatch.setattr(proto, "train_cgmia_seeds_on_ray", fake_ray_train)
    shadow, target = synthetic_collection(n=60, seed=1), synthetic_collection(n=40, seed=2, prefix="u")
    small = CGMIAConfig(epochs=2, expert_proj_dim=16, hidden=(8,), batch_size=32)
    on = proto.evaluate_detectors(shadow, target, small, [3, 4], detectors=["cgmia"], use_ray_train=True,
                                  bootstrap=0, trace_memory=False)
    off = proto.evaluate_detectors(shadow, target, small, [3, 4], detectors=["cgmia"], use_ray_train=False,
                                   bootstrap=0, trace_memory=False)
    assert calls == [[3, 4]]  # lent once for every seed, and only when asked
    assert [m["auc"] for m in on["per_seed"]["cgmia"]] == [m["auc"] for m in off["per_seed"]["cgmia"]]


def test_the_composites_fit_their_seeds_in_one_task_and_build_their_inputs_once(monkeypatch):
    """A learned detector's seeds are separate Ray tasks, except a composite's: its inputs cost
    more than its fits, so its seeds share one task where each collection's inputs are built once."""
    from leakray.detect import combined
    from leakray.protocols.detectors import plan_jobs

    seeds = [0, 1, 2]
    spread, driver = plan_jobs([["transformer"], ["leakray_combined"], ["text_combined"], ["min_k"],
                                ["lr", "svm"]], seeds, parallel=True)
    assert (["transformer"], [0]) in spread and (["transformer"], [2]) in spread
    assert (["leakray_combined"], seeds) in spread and (["text_combined"], seeds) in spread
    assert (["min_k"], seeds) in spread and driver == [(["lr", "svm"], seeds)]  # its own Tune run
    assert plan_jobs([["transformer"]], seeds, parallel=False) == ([], [(["transformer"], seeds)])

    built = []
    real = combined._BUILDERS["expert"]
    monkeypatch.setitem(combined._BUILDERS, "expert", (lambda t: built.append(t) or real[0](t), real[1]))
    shadow, target = synthetic_collection(n=60, seed=1), synthetic_collection(n=40, seed=2, prefix="u")
    dets = registry.detector_class("leakray_combined").fit_seeds(shadow, seeds, {"groups": ["expert"]})
    scores = [d.score(target) for d in dets]
    assert [t is shadow for t in built] == [True, False]  # once per collection for three seeds
    again = registry.make("leakray_combined", {"groups": ["expert"]}).fit(synthetic_collection(n=60, seed=1), 0)
    np.testing.assert_array_equal(again.score(target), scores[0])  # an equal table built anew: the same result
    assert len(built) == 3


def test_per_table_computes_once_per_table_object_while_it_lives():
    import gc

    from leakray.detect import arrays

    calls = []

    def compute():
        calls.append(1)
        return np.arange(3.0), ["a"]

    t = pa.table({"x": [1, 2, 3]})
    x, names = arrays.per_table(t, "k", compute)
    assert arrays.per_table(t, "k", compute)[0] is x and len(calls) == 1
    assert not x.flags.writeable  # a cached input cannot be changed under the next reader
    arrays.per_table(t, "other", compute)
    arrays.per_table(pa.table({"x": [1, 2, 3]}), "k", compute)  # another object: computed again
    assert len(calls) == 3
    key = id(t)
    del t, x
    gc.collect()
    assert key not in arrays._PER_TABLE  # nothing kept for a table that is gone
