"""The AdvPrompt perturbation stage (proof in the sandbox, fold back to one row per task) and
the detector's two settings on a collection."""

import numpy as np
import pyarrow as pa
import pytest
import pyarrow.parquet as pq

from leakray.data.humaneval import read_humaneval
from leakray.stages.collect import input_table
from leakray.stages.prove import attach_variants, kept_summary, prove_batch, prove_parts
from leakray.schema import C, T, TASK_SCHEMA


def test_prove_batch_folds_kept_variants_into_one_row_per_task(tmp_path):
    from leakray.sandbox import Sandbox, SandboxConfig

    tasks = read_humaneval()[:3]
    table = pa.Table.from_pylist([{k: t[k] for k in T.ALL} for t in tasks], schema=TASK_SCHEMA)
    out = prove_batch(table, Sandbox(SandboxConfig(timeout_s=10)), seed=0)
    assert out.column(C.TASK_ID).to_pylist() == [t[T.TASK_ID] for t in tasks]
    for task, prompts, kinds in zip(tasks, out.column(C.ADV_PROMPTS).to_pylist(), out.column(C.ADV_KIND).to_pylist()):
        assert len(prompts) == len(kinds) == 12 and kinds[0] == "base" and prompts[0] == task[T.PROMPT]
        assert all((p == "") == (k == "") for p, k in zip(prompts[1:], kinds[1:]))
        assert sum(bool(k) for k in kinds[1:]) >= 9  # HumanEval: nearly every kind applies and is kept
        assert all(p != task[T.PROMPT] for p in prompts[1:] if p)
    summary = kept_summary(out)
    assert summary["python/IDC"]["kept"] == 6 and summary["python/IDC"]["rate"] == 1.0
    # the batch's time, per row: writing the variants, then proving them (the stage's parts)
    out, timed = prove_parts(out)
    assert C.PART_SECONDS not in out.column_names
    seconds, tried = timed["part_seconds"], sum(len(c) for c in out.column("check").to_pylist())
    # (writing three tasks' variants takes milliseconds: its seconds may round to 0.0, its rate not)
    assert set(seconds) == {"generate", "prove"} and seconds["prove"] > seconds["generate"] >= 0
    assert timed["throughput"]["variants_written_per_s"] > timed["throughput"]["variants_proven_per_s"]
    assert timed["throughput"]["variants_proven_per_s"] == pytest.approx(tried / seconds["prove"], rel=0.02)
    pq.write_table(out, tmp_path / "variants.parquet")
    joined = attach_variants(input_table(tasks[::-1], {}, set()), tmp_path / "variants.parquet")
    assert joined.column(C.ADV_PROMPTS).to_pylist()[0][0] == tasks[-1][T.PROMPT]
    # one kind only (columns.advprompt_kinds): its variants are the same ones, the rest not tried
    (one,) = prove_batch(table.slice(0, 1), Sandbox(SandboxConfig(timeout_s=10)), seed=0, kinds=["IDP"]).to_pylist()
    every = out.to_pylist()[0]
    assert one[C.ADV_KIND] == ["base", "", "", "", "", "", "", "IDP1", "IDP2", "", "", ""]
    assert one[C.ADV_PROMPTS] == [p if k in ("base", "IDP1", "IDP2") else "" for p, k in
                                  zip(every[C.ADV_PROMPTS], every[C.ADV_KIND])]
    assert [c.split("|")[1] for c in one["check"]] == ["IDP", "IDP"]


def test_proven_variants_are_reused_across_runs_by_task_and_settings(tmp_path, monkeypatch):
    """A second run proves only what no earlier run proved under the same settings: the same
    tasks are read back from $LEAKRAY_CACHE; another timeout, a changed task, or a task with a
    failed variant (a failure may be a busy machine's timeout) is proved again."""
    import leakray.stages.prove as prove
    from leakray.protocols.collection import prove_variants_to

    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "cache"))
    proved = []

    def fake_prove(batch, sandbox, seed, threads=2, kinds=None):  # the sandbox's verdicts, stood in for by a rule
        ids = batch.column(C.TASK_ID).to_pylist()
        proved.extend(ids)
        asked.append(kinds)
        return pa.table({C.TASK_ID: ids, C.ADV_PROMPTS: [[f"{t} {seed}", ""] for t in ids],
                         C.ADV_KIND: [["base", ""] for _ in ids],
                         "check": [["python|IDC|kept", f"python|FDC|{'failed' if t == flaky else 'kept'}"]
                                   for t in ids],
                         C.PART_SECONDS: [[0.5, 1.5] for _ in ids]})

    monkeypatch.setattr(prove, "prove_batch", fake_prove)
    asked = []
    tasks = read_humaneval()[:5]
    flaky = tasks[4][T.TASK_ID]
    args = {"seed": 0, "timeout_s": 10.0, "threads": 1, "actors": 1, "allow_weak_isolation": True, "engine": "local"}

    def run(name, tasks, **over):
        proved.clear()
        (tmp_path / name).mkdir()
        got = prove_variants_to(tasks, tmp_path / name, **{**args, **over})
        return got, pq.read_table(tmp_path / name / "variants.parquet")

    first, v1 = run("a", tasks[:3])
    assert first["from_cache"] == 0 and sorted(proved) == sorted(t[T.TASK_ID] for t in tasks[:3])
    # the stage's parts sum the proved rows' seconds; the rows are stored without them
    assert first["part_seconds"] == {"generate": 1.5, "prove": 4.5} and C.PART_SECONDS not in v1.column_names
    assert first["throughput"] == {"variants_written_per_s": 4.0, "variants_proven_per_s": 1.3}
    again, v2 = run("b", tasks[:4])  # three proved before, one new
    assert again["from_cache"] == 3 and proved == [tasks[3][T.TASK_ID]]
    assert again["part_seconds"] == {"generate": 0.5, "prove": 1.5}  # the cached rows cost nothing now
    assert v2.column(C.TASK_ID).to_pylist() == sorted(t[T.TASK_ID] for t in tasks[:4])
    assert v2.slice(0, 3).equals(v1.sort_by(C.TASK_ID)) and again["kept"]["python/IDC"]["kept"] == 4
    other, _ = run("c", tasks[:4], timeout_s=20.0)  # other sandbox limits: another verdict may follow
    assert other["from_cache"] == 0 and len(proved) == 4
    changed = [dict(tasks[0], **{T.REFERENCE: tasks[0][T.REFERENCE] + "\n"}), *tasks[1:4]]
    edited, _ = run("d", changed)
    assert edited["from_cache"] == 3 and proved == [tasks[0][T.TASK_ID]]
    run("e", tasks)  # the flaky task's failed variant: proved, not stored
    retried, _ = run("f", tasks)
    assert retried["from_cache"] == 4 and proved == [flaky]
    # fewer kinds: whole cached rows are read, the rest proved for those kinds only, and kept
    # under those kinds (never read back as a whole row)
    asked.clear()
    fewer, _ = run("g", read_humaneval()[:7], kinds=["IDC"])
    new = [t[T.TASK_ID] for t in read_humaneval()[5:7]]
    assert fewer["from_cache"] == 4 and sorted(proved) == sorted([flaky, *new])
    assert asked == [["IDC"]]
    again, _ = run("h", read_humaneval()[:7], kinds=["IDC"])
    assert again["from_cache"] == 6 and proved == [flaky]
    other, _ = run("i", read_humaneval()[:7], kinds=["IDC", "VR"])
    assert other["from_cache"] == 4 and sorted(proved) == sorted([flaky, *new]) and asked[-1] == ["IDC", "VR"]
    every, _ = run("j", read_humaneval()[:7], kinds=["IDC", "IRV", "VR", "IDP", "IDL"])  # all five: whole rows
    assert every["from_cache"] == 4 and asked[-1] is None
    assert run("k", read_humaneval()[:7])[0]["from_cache"] == 6


def _adv_collection(n: int, seed: int, signal: float) -> pa.Table:
    """Members' perturbed completions stay near the reference; non-members' drift."""
    rng = np.random.default_rng(seed)
    d = 16
    member = np.array([1, 0] * (n // 2), dtype=np.int8)
    ref = rng.normal(size=(n, d))
    drift = np.where(member[:, None, None] == 1, 1 - signal, 1.0)
    emb = ref[:, None, :] + drift * rng.normal(size=(n, 12, d)) * 1.5
    kinds = [["base"] + [f"S{j}" if (i + j) % 7 else "" for j in range(11)] for i in range(n)]
    ppl = np.exp(rng.normal(size=(n, 12)) * np.where(member[:, None] == 1, 0.5 - 0.4 * signal, 0.5))
    return pa.table({C.TASK_ID: [f"T/{seed}/{i}" for i in range(n)], C.MEMBER: member,
                     C.REF_EMBEDDING: ref.astype(np.float32).tolist(),
                     C.ADV_EMBEDDING: emb.reshape(n, -1).astype(np.float32).tolist(),
                     C.ADV_PERPLEXITY: ppl.astype(np.float32).tolist(), C.ADV_KIND: kinds})


def test_advprompt_both_settings_separate_a_planted_signal_and_not_noise():
    from sklearn.metrics import roc_auc_score

    from leakray.detect import registry
    from leakray.detect.advprompt import AdvPromptConfig, arrays_from_table
    from leakray.protocols.advprompt_eval import evaluate_advprompt

    small = AdvPromptConfig(epochs=8, batch_size=16)  # the paper's 25 epochs of 4 rows: minutes here

    def shadow_setting_auc(shadow, target):  # the registry detector, as cards and audits run it
        det = registry.make("advprompt", {"config": small.to_dict()}).fit(shadow, 0)
        th = det.threshold(shadow, "shadow_max_mcc")
        assert th["chosen_on"].startswith("shadow, out-of-fold")
        score = det.score(target)  # the member log-odds, the threshold's scale too (a probability saturates)
        np.testing.assert_allclose(det.model.predict_proba(arrays_from_table(target)), 1 / (1 + np.exp(-score)))
        assert np.isfinite(th["value"]) and (score < 0).any() and np.ptp(det.heldout(shadow)[1]) > 1
        return roc_auc_score(target.column(C.MEMBER).to_numpy(), score)

    shadow, target = _adv_collection(60, 1, 0.8), _adv_collection(80, 2, 0.8)
    assert shadow_setting_auc(shadow, target) > 0.85
    res = evaluate_advprompt(shadow, target, [0], threshold_rule="shadow_max_mcc", bootstrap=50, config=small)
    assert res["median"]["advprompt_graybox"]["auc"] > 0.85
    assert res["median"]["advprompt_graybox"]["n"] < target.num_rows  # scored on the unknown rows only
    assert 0.3 < shadow_setting_auc(_adv_collection(60, 3, 0.0), _adv_collection(80, 4, 0.0)) < 0.7


def test_advprompt_text_needs_no_perplexity_and_finds_the_similarity_signal():
    """The text-only variant: what an endpoint without log-probabilities gives (NaN perplexities,
    or none) is enough for it, its scores do not read them, and the similarity signal alone
    separates members; the full detector cannot take such a collection."""
    import pytest
    from sklearn.metrics import roc_auc_score

    from leakray.detect import registry
    from leakray.detect.advprompt import PERPLEXITY_FEATURES, AdvPromptConfig
    from leakray.errors import BadInput

    def text_only(table, drop=False):
        if drop:
            return table.drop_columns([C.ADV_PERPLEXITY])
        nan = pa.array([[float("nan")] * 12] * table.num_rows, table.schema.field(C.ADV_PERPLEXITY).type)
        return table.set_column(table.schema.get_field_index(C.ADV_PERPLEXITY), C.ADV_PERPLEXITY, nan)

    spec = registry.spec("advprompt_text")
    assert spec.access == "black box" and C.ADV_PERPLEXITY not in spec.columns and spec.learns
    small = AdvPromptConfig(epochs=8, batch_size=16, drop_features=("sim_std",)).to_dict()
    shadow, target = _adv_collection(60, 1, 0.8), _adv_collection(80, 2, 0.8)
    det = registry.make("advprompt_text", {"config": small}).fit(text_only(shadow), 0)
    # a user's own drops are kept, and the perplexity features are out whatever the config says
    assert set(det.config.drop_features) == {"sim_std", *PERPLEXITY_FEATURES} and det.model.in_dim == 13
    assert det.threshold(text_only(shadow), "shadow_max_mcc")["chosen_on"].startswith("shadow, out-of-fold")
    member = target.column(C.MEMBER).to_numpy()
    scores = det.score(text_only(target))
    assert roc_auc_score(member, scores) > 0.85
    # the perplexities are not read: present, NaN or absent, the same scores
    assert np.array_equal(scores, det.score(target)) and np.array_equal(scores, det.score(text_only(target, True)))
    with pytest.raises(BadInput, match="unperturbed perplexity must be finite"):
        registry.make("advprompt", {"config": small}).fit(text_only(shadow), 0)
    noise = registry.make("advprompt_text", {"config": small}).fit(_adv_collection(60, 3, 0.0), 0)
    clean = _adv_collection(80, 4, 0.0)
    assert 0.3 < roc_auc_score(clean.column(C.MEMBER).to_numpy(), noise.score(clean)) < 0.7


def test_advprompt_ablation_names_every_kind_and_feature():
    from leakray.detect.advprompt import FEATURE_NAMES, AdvPromptConfig
    from leakray.perturb.core import KINDS
    from leakray.protocols.advprompt_eval import advprompt_ablation

    ab = advprompt_ablation(_adv_collection(40, 5, 0.8), _adv_collection(40, 6, 0.8),
                            config=AdvPromptConfig(epochs=3, batch_size=20, hidden=(32,)))
    assert set(ab["without_kind"]) == set(KINDS) and set(ab["without_feature"]) == set(FEATURE_NAMES)
    assert ab["not_collected"] == []
    assert ab["all"] > 0.8  # the planted stability signal is there with every input


def _variants_file(path, ids):
    """A perturb stage's output for ``ids``: every slot present (its prompt names task and slot)."""
    from leakray.detect.advprompt import SLOT_NAMES

    pq.write_table(pa.table({C.TASK_ID: ids,
                             C.ADV_PROMPTS: [[f"{t}:base"] + [f"{t}:{s}" for s in SLOT_NAMES] for t in ids],
                             C.ADV_KIND: [["base", *SLOT_NAMES] for _ in ids],
                             "check": [[] for _ in ids]}), path)


def test_advprompt_kinds_leave_the_other_kinds_slots_empty_in_the_collections_input(tmp_path):
    """columns.advprompt_kinds reaches the collection's input: only the chosen kinds' variants
    (and slot 0, the task's own prompt) are there to complete; the others are missing slots."""
    import pytest

    from leakray.config import load_config
    from leakray.detect.advprompt import SLOT_NAMES
    from leakray.errors import BadInput
    from leakray.protocols.collection import with_variants

    tasks = read_humaneval()[:2]
    _variants_file(tmp_path / "variants.parquet", [t[T.TASK_ID] for t in tasks])
    table = input_table(tasks, {}, set())
    every = with_variants(table, load_config(), tmp_path)  # the default: all five kinds
    assert every.column(C.ADV_KIND).to_pylist() == [["base", *SLOT_NAMES]] * 2
    some = with_variants(table, load_config([], ["columns.advprompt_kinds=[IDL, VR]"]), tmp_path)
    for task, prompts, kinds in zip(tasks, some.column(C.ADV_PROMPTS).to_pylist(), some.column(C.ADV_KIND).to_pylist()):
        assert kinds == ["base", "", "", "", "", "VR1", "VR2", "", "", "IDL1", "IDL2", "IDL3"]
        assert prompts[0] == f"{task[T.TASK_ID]}:base"
        assert [bool(p) for p in prompts] == [bool(k) for k in kinds]
    with pytest.raises(BadInput, match="unknown AdvPrompt kinds"):
        attach_variants(table, tmp_path / "variants.parquet", kinds=["IDX"])


def test_advprompt_kinds_setting_is_checked_and_spelled_one_way():
    import pytest

    from leakray.config import ADVPROMPT_KINDS, load_config
    from leakray.errors import BadInput
    from leakray.perturb.core import KINDS

    assert ADVPROMPT_KINDS == KINDS  # config spells out what the perturbations define
    a = load_config([], ["columns.advprompt_kinds=[IDL, IDC, IDL]"])
    assert a.columns.advprompt_kinds == ["IDC", "IDL"]
    assert a.hashed() == load_config([], ["columns.advprompt_kinds=[IDC, IDL]"]).hashed()
    for bad, hint in (("[]", "at least one kind"), ("[IDQ]", "IDC")):
        with pytest.raises(BadInput, match=hint):
            load_config([], [f"columns.advprompt_kinds={bad}"])


def test_advprompt_ablation_skips_a_kind_that_was_not_collected():
    """A kind outside columns.advprompt_kinds is masked in both collections: its ablation
    rows would refit "all" again, so they are named as not collected instead."""
    from leakray.detect.advprompt import FEATURE_NAMES, AdvPromptConfig
    from leakray.protocols.advprompt_eval import advprompt_ablation

    def without_idc(t):
        kinds = [[k if not 1 <= j <= 2 else "" for j, k in enumerate(row)] for row in t.column(C.ADV_KIND).to_pylist()]
        return t.set_column(t.column_names.index(C.ADV_KIND), C.ADV_KIND, pa.array(kinds, pa.list_(pa.string())))

    ab = advprompt_ablation(without_idc(_adv_collection(40, 5, 0.8)), without_idc(_adv_collection(40, 6, 0.8)),
                            config=AdvPromptConfig(epochs=3, batch_size=20, hidden=(32,)))
    assert ab["not_collected"] == ["IDC"] and set(ab["without_kind"]) == {"IRV", "VR", "IDP", "IDL"}
    assert set(ab["without_feature"]) == set(FEATURE_NAMES) - {"sim_IDC1", "sim_IDC2", "ppl_IDC1", "ppl_IDC2"}
    assert ab["all"] > 0.8
