"""A learned detector's inner splits (its validation split, its cross-fitted folds) keep a
benchmark's near-copies on one side (`detect.base.keyed_by_copies`), as the protocol's splits do."""

import numpy as np
import pyarrow as pa
import pytest
from cgmia_data import rich_collection
from sklearn.metrics import roc_auc_score

from leakray.detect.base import keyed_by_copies, split_by_task, task_keys
from leakray.schema import C


def _twinned(n: int = 80, seed: int = 0) -> tuple[pa.Table, list[list[str]]]:
    """``n`` tasks with no membership signal at all, each under a second id (``c<i>``, the same
    text, embeddings and label): a benchmark whose every task has a near-copy."""
    base = rich_collection(n=n, signal=0, seed=seed)
    twin = base.set_column(base.schema.get_field_index(C.TASK_ID), C.TASK_ID, pa.array([f"c{i}" for i in range(n)]))
    return pa.concat_tables([base, twin]), [[f"c{i}", f"t{i}"] for i in range(n)]


def _sides(ids, groups, *parts):
    """For each group, the set of parts (indices into ``parts``) holding one of its tasks."""
    where = {t: i for i, part in enumerate(parts) for t in part}
    return [{where[t] for t in g if t in where} for g in groups]


def test_keys_merge_a_group_and_leave_the_rest():
    shadow, groups = _twinned(n=6)
    assert keyed_by_copies(shadow, []) is shadow  # no group: the table as it was (the splits as before)
    assert keyed_by_copies(shadow, [["t0"]]) is shadow
    keyed = keyed_by_copies(shadow, groups[:2])
    keys = dict(zip(keyed.column(C.TASK_ID).to_pylist(), task_keys(keyed)))
    assert keys["t0"] == keys["c0"] == task_keys(shadow)[6] and keys["t1"] == keys["c1"]
    assert len({keys[t] for t in ("t2", "c2", "t3", "c3")}) == 4  # tasks of no group keep their own key
    # a group whose first task is not in this table (on the other side of an outer split) still joins its rest
    part = keyed_by_copies(shadow.filter(pa.array([t != "c0" for t in shadow.column(C.TASK_ID).to_pylist()])),
                           [["c0", "t0", "t5"]])
    keys = dict(zip(part.column(C.TASK_ID).to_pylist(), task_keys(part)))
    assert keys["t0"] == keys["t5"] != keys["t1"]
    # keyed again with other groups: the old key is replaced, not kept beside
    again = keyed_by_copies(keyed, groups[2:3])
    assert again.column_names.count(C.SPLIT_KEY) == 1
    keys = dict(zip(again.column(C.TASK_ID).to_pylist(), task_keys(again)))
    assert keys["t2"] == keys["c2"] and keys["t0"] != keys["c0"]


@pytest.mark.parametrize("seed", range(5))
def test_validation_split_keeps_each_group_on_one_side(seed):
    shadow, groups = _twinned()
    keyed = keyed_by_copies(shadow, groups)
    y = keyed.column(C.MEMBER).to_numpy()
    ids = np.asarray(keyed.column(C.TASK_ID).to_pylist())
    tr, va = split_by_task(task_keys(keyed), y, 0.4, seed)
    assert all(len(s) == 1 for s in _sides(ids, groups, ids[tr], ids[va]))
    tr, va = split_by_task(task_keys(shadow), y, 0.4, seed)  # without the groups, copies straddle
    assert sum(len(s) == 2 for s in _sides(ids, groups, ids[tr], ids[va])) >= 10


def test_a_learned_detector_validated_on_copies_of_its_training_tasks_looks_good_on_nothing():
    """The failure this prevents: no membership signal, yet the detector (Gotcha's MLP on the
    reference embedding) validated with copies of its training tasks reads an AUC far from 0.5,
    since it recalls its twin's label; kept together, the validation reads chance."""
    from leakray.detect.gotcha import Gotcha

    shadow, groups = _twinned()
    y, s, _ = Gotcha().fit(shadow, 0).heldout(shadow)
    assert roc_auc_score(y, s) >= 0.8  # measured 0.93 (seeds 0–3: 0.85–0.97)
    keyed = keyed_by_copies(shadow, groups)
    y, s, _ = Gotcha().fit(keyed, 0).heldout(keyed)
    assert abs(roc_auc_score(y, s) - 0.5) <= 0.2  # measured 0.48 (seeds 0–3: 0.43–0.61)


class _Recorder:
    """Stands in for a fitted model: records which tasks it was fitted on and which it scored."""

    def __init__(self, log, fitted):
        self.log, self.fitted = log, fitted

    def predict_log_odds(self, arrays):
        self.log.append((_tasks(self.fitted), _tasks(arrays["task_id"])))
        return np.zeros(len(arrays["task_id"]))


def _tasks(keys) -> set[int]:
    """The task numbers behind split keys: ``t3`` and its copy ``c3`` are both task 3."""
    return {int(str(k).rsplit("\x1f", 1)[-1][1:]) for k in keys}


@pytest.mark.parametrize("module", ["cgmia", "advprompt"])
def test_cross_fitted_folds_keep_each_group_in_one_fold(module, monkeypatch):
    import importlib

    mod = importlib.import_module(f"leakray.detect.{module}")
    shadow, groups = _twinned()
    log = []
    monkeypatch.setattr(mod, "fit", lambda arrays, *a, **k: _Recorder(log, arrays["task_id"]))
    for table, together in ((keyed_by_copies(shadow, groups), True), (shadow, False)):
        log.clear()
        arrays = mod.arrays_from_table(table if module == "cgmia" else _with_advprompt_columns(table))
        assert np.isfinite(mod.cross_fit_log_odds(arrays, seed=3)).all()
        crossed = sum(len(fitted & held) for fitted, held in log)
        assert (crossed == 0) if together else (crossed > 0)  # without groups a copy's twin is in the fit



def _with_advprompt_columns(table: pa.Table) -> pa.Table:
    """Random AdvPrompt columns (slot 0 the prompt, every variant present): what its folds need."""
    from leakray.detect.advprompt import N_VARIANTS

    n, d, slots = table.num_rows, len(table.column(C.REF_EMBEDDING)[0]), N_VARIANTS + 1
    rng = np.random.default_rng(0)
    return (table.append_column(C.ADV_EMBEDDING, pa.array(rng.normal(size=(n, slots * d)).tolist(), pa.list_(pa.float32())))
            .append_column(C.ADV_PERPLEXITY, pa.array(rng.uniform(1, 3, (n, slots)).tolist()))
            .append_column(C.ADV_KIND, pa.array([["base"] + ["IDP"] * N_VARIANTS] * n)))


def test_evaluate_detectors_keys_the_shadow_by_its_copy_groups():
    """The protocols hand the benchmark's groups to `evaluate_detectors` (`copy_groups`): the cut a
    learned detector chooses on its validation split is then chosen on tasks it did not read."""
    from leakray.protocols.detectors import evaluate_detectors

    shadow, groups = _twinned()
    target = rich_collection(n=40, signal=0, seed=9, prefix="u")
    mcc = {}
    for name, g in (("copies split", []), ("kept together", groups)):
        result = evaluate_detectors(shadow, target, seeds=[0], detectors=["gotcha"], bootstrap=0, copy_groups=g)
        mcc[name] = result["per_seed"]["gotcha"][0]["threshold"]["mcc"]
    assert mcc["copies split"] >= 0.5 and mcc["kept together"] <= 0.4, mcc  # measured 0.76 and 0.26


def test_graybox_split_knows_a_group_whole_or_scores_it_whole():
    """AdvPrompt's gray-box setting trains on target rows and scores the others: a copy scored while
    its twin is known would be scored on its own training text."""
    from leakray.detect.advprompt import graybox_split

    rng = np.random.default_rng(0)
    member = rng.choice([0, 1], size=120)
    keys = np.asarray([f"g{i // 2}" for i in range(120)])  # rows 2i and 2i+1 are copies
    member[1::2] = member[0::2]  # a group shares its label (one task under two ids)
    straddled = 0
    for seed in range(8):
        train, test = graybox_split(member, 0.2, seed, groups=keys)
        assert not set(keys[train]) & set(keys[test])
        assert len(set(train) & set(test)) == 0 and (member[train] == 1).sum() == round(0.2 * member.sum())
        plain_train, plain_test = graybox_split(member, 0.2, seed)
        straddled += len(set(keys[plain_train]) & set(keys[plain_test]))
    assert straddled >= 8  # drawn row by row, copies land on both sides
    # every key its own row: the row-by-row draw, to the index
    for seed in range(4):
        for got, want in zip(graybox_split(member, 0.3, seed, groups=np.arange(120)), graybox_split(member, 0.3, seed)):
            np.testing.assert_array_equal(got, want)


def test_evaluate_advprompt_splits_the_target_by_its_copy_groups(monkeypatch):
    from leakray.detect import advprompt as ap
    from leakray.protocols.advprompt_eval import advprompt_part

    seen = []
    real = ap.graybox_split

    def recording(member, known_fraction=0.2, seed=0, balanced_test=True, groups=None):
        seen.append(groups)
        return real(member, known_fraction, seed, balanced_test, groups)

    monkeypatch.setattr(ap, "graybox_split", recording)
    monkeypatch.setattr(ap, "fit", lambda *a, **k: (_ for _ in ()).throw(ap.BadInput("stop here")))
    n = 40
    target = pa.table({C.TASK_ID: [f"t{i}" for i in range(n)], C.MEMBER: np.array([1, 0] * (n // 2), np.int8),
                       C.REF_EMBEDDING: np.ones((n, 4), np.float32).tolist(),
                       C.ADV_EMBEDDING: np.ones((n, 48), np.float32).tolist(),
                       C.ADV_PERPLEXITY: np.ones((n, 12), np.float32).tolist(),
                       C.ADV_KIND: [["base"] + ["IDP"] * 11] * n})
    out = advprompt_part("graybox", target, target, [0], "shadow_max_mcc", 0, [["t0", "t2"]])
    assert "stop here" in out["result"]["skipped"]["advprompt_graybox"]  # the split ran, then the stubbed fit refused
    keys = dict(zip(target.column(C.TASK_ID).to_pylist(), seen[0]))
    assert keys["t0"] == keys["t2"] and len(set(seen[0])) == n - 1
    seen.clear()
    advprompt_part("graybox", target, target, [0], "shadow_max_mcc", 0)
    assert len(set(seen[0])) == n  # no groups: every task its own key


def test_evaluate_detectors_draws_the_targets_copies_whole_in_its_intervals():
    from leakray.protocols.detectors import evaluate_detectors

    shadow = rich_collection(n=40, signal=1.0, seed=3, prefix="s")
    target, groups = _twinned(n=30)  # the target holds every task twice
    got = {}
    for name, g in (("ignored", []), ("together", groups)):
        m = evaluate_detectors(shadow, target, seeds=[0], detectors=["ref_loss"], bootstrap=400,
                               copy_groups=g)["per_seed"]["ref_loss"][0]
        got[name] = m
    assert got["ignored"]["auc"] == got["together"]["auc"]
    assert got["together"]["bootstrap"]["method"].endswith("near-copy groups drawn whole")
    width = {k: m["auc_ci"][1] - m["auc_ci"][0] for k, m in got.items()}
    assert width["together"] > 1.15 * width["ignored"], width
