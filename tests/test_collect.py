"""The collection stages on tiny inputs, in-process (no Ray)."""

import pyarrow as pa
import pytest

from leakray.data.humaneval import read_humaneval
from leakray.data.tasks import continuation
from leakray.models.sampler import SampleConfig
from leakray.protocols.collection import collect
from leakray.stages.collect import CollectConfig, finalize, input_table
from leakray.stages.execute import ExecuteStage
from leakray.schema import C, T, collection_schema


def _tasks(n=3):
    return read_humaneval()[:n]


def test_execute_stage_proves_passes_and_refuses_fake_ones():
    tasks = _tasks(2)
    table = input_table(tasks, {}, set())
    good = [continuation(t[T.PROMPT], t[T.REFERENCE]) for t in tasks]
    fake = ["    import sys\n    sys.exit(0)\n", "    raise SystemExit(0)\n"]
    table = table.append_column(C.COMPLETIONS, pa.array([[g, f] for g, f in zip(good, fake)],
                                                        pa.list_(pa.string())))
    out = ExecuteStage(timeout_s=10, threads=2)(table)
    assert out.column(C.PASSED).to_pylist() == [[True, False], [True, False]]
    assert all(s[0] == "passed" and s[1] != "passed" for s in out.column(C.EXEC_STATUS).to_pylist())
    assert out.column(C.HAS_TESTS).to_pylist() == [True, True]


def test_collect_local_writes_the_collection_schema(tiny_lm):
    path, _ = tiny_lm
    tasks = _tasks(3)
    members = {tasks[0][T.TASK_ID]}
    table = input_table(tasks, {t[T.TASK_ID]: i for i, t in enumerate(tasks)}, members)
    cfg = CollectConfig(sample=SampleConfig(k=2, max_new_tokens=16, batch_size=2), batch_size=2)
    out = collect(table, str(path), cfg, engine="local")
    assert out.schema.equals(collection_schema())
    assert out.column(C.TASK_ID).to_pylist() == sorted(t[T.TASK_ID] for t in tasks)
    assert out.column(C.MEMBER).to_pylist() == [1, 0, 0]
    row = out.to_pylist()[1]
    assert len(row[C.COMPLETIONS]) == len(row[C.PASSED]) == len(row[C.CODEBLEU]) == 2
    assert len(row[C.EXPERT]) == 8 and row[C.EXPERT][:2] == row[C.PERPLEXITY]
    d = len(row[C.REF_EMBEDDING])
    assert d == 384 and len(row[C.GEN_EMBEDDING]) == 2 * d
    assert row[C.REF_LOSS] > 0
    # where the time went: every part ran (the model and encoder loads with the first batch)
    from leakray.stages.collect import collection_stats
    from leakray.stages.rows import PARTS

    parts = collection_stats(out, 1.0)["part_seconds"]
    assert set(parts) == set(PARTS) and parts["upper_case"] == parts["advprompt"] == parts["probes"] == 0.0  # all off
    assert all(parts[p] > 0 for p in ("load", "sample", "reference", "execute", "score", "embed")), parts
    assert sum(parts.values()) == pytest.approx(sum(map(sum, out.column(C.PART_SECONDS).to_pylist())), abs=0.05)
    assert collection_stats(out, 1.0)["throughput"]["generated_tokens_per_s"] > 0


def test_rows_collected_before_the_extra_passes_were_split_still_add_up():
    """A collection an earlier version started, resumed: its rows read back carry seven parts, the
    extra passes in one; the stage's stats keep that part beside the new rows' three."""
    from leakray.stages.collect import part_stats
    from leakray.stages.rows import LEGACY_PARTS, PARTS, add_part_seconds, row_parts

    old = dict.fromkeys(LEGACY_PARTS, 0.0) | {"sample": 2.0, "extra_passes": 3.0}
    new = dict.fromkeys(PARTS, 0.0) | {"sample": 1.0, "advprompt": 0.5, "probes": 0.25}
    table = pa.table({C.PART_SECONDS: [list(old.values()), list(new.values())],
                      C.COMPLETIONS: [["a"], ["b"]]})
    busy = part_stats(table, 10, 2)["part_seconds"]
    assert busy["sample"] == 3.0 and busy["extra_passes"] == 3.0 and busy["advprompt"] == 0.5 and busy["probes"] == 0.25
    assert add_part_seconds(table, {"sample": [1.0, 1.0]}).column(C.PART_SECONDS).to_pylist()[0][1] == 3.0
    with pytest.raises(ValueError, match="9 expected"):
        row_parts([0.0] * 4)


def test_finalize_drops_retried_duplicates():
    tasks = _tasks(2)
    table = input_table(tasks + tasks[:1], {}, set())
    schema = collection_schema()
    for name in schema.names:
        if name not in table.column_names:
            table = table.append_column(schema.field(name), pa.nulls(table.num_rows, schema.field(name).type))
    assert finalize(table).num_rows == 2


class _FlakySampler:
    """Fails one task for good (as the endpoint sampler does after its retries), truncates another."""

    def __init__(self, k):
        from collections import Counter

        from leakray.models.sampler import SampleConfig

        self.cfg, self.stats = SampleConfig(k=k), Counter()

    def sample(self, prompts, languages, keys, *, k=None, greedy=False):
        from leakray.models.sampler import Samples

        (key,) = keys
        if key.endswith("/1"):
            return [Samples([], [], [], notes=["endpoint_failed:http_500"])]
        if key.endswith("/2"):
            self.stats["prompt_truncated_left"] += 1
        return [Samples(["    return 1\n"] * self.cfg.k, [2.0] * self.cfg.k, [3] * self.cfg.k)]

    def reference_scores(self, prompts, references):
        from leakray.models.sampler import RefScores

        return [RefScores(1.5, [-1.0, -2.0], None, None, None, ["ref_mu_sigma_unavailable"])]


def test_a_row_that_fails_for_good_goes_to_the_errors_file(tmp_path):
    import pyarrow.parquet as pq

    from leakray.stages.collect import collection_stats
    from leakray.stages.sample import SampleStage
    from leakray.stages.score import score_stage

    tasks = _tasks(3)
    from leakray.stages.sample import ExtraColumns

    stage = SampleStage.__new__(SampleStage)
    stage.sampler, stage.extra, stage.ref_sampler, stage.alt_sampler = _FlakySampler(k=2), ExtraColumns(), None, None
    table = score_stage(ExecuteStage(timeout_s=10, threads=2)(stage(input_table(tasks, {}, set()))))
    notes = dict(zip(table.column(C.TASK_ID).to_pylist(), table.column(C.NOTES).to_pylist()))
    assert notes["HumanEval/2"] == ["ref_mu_sigma_unavailable", "prompt_truncated_left"]
    assert notes["HumanEval/0"] == ["ref_mu_sigma_unavailable"]
    assert table.column(C.EXEC_STATUS).to_pylist()[1] == ["not-run", "not-run"]
    out = finalize(table, tmp_path / "errors.parquet")
    assert out.column(C.TASK_ID).to_pylist() == ["HumanEval/0", "HumanEval/2"]
    errors = pq.read_table(tmp_path / "errors.parquet").to_pylist()
    assert errors == [{C.TASK_ID: "HumanEval/1", C.NOTES: ["endpoint_failed:http_500", "ref_mu_sigma_unavailable"]}]
    stats = collection_stats(out, 1.0, tmp_path / "errors.parquet")
    assert stats["errors"]["endpoint_failed:http_500"] == 1 and stats["errors"]["prompt_truncated_left"] == 1


class _CrashingSampler(_FlakySampler):
    """Raises for the tasks in `crash` as a tokenizer does on input it cannot encode."""

    def __init__(self, k, crash):
        super().__init__(k)
        self.crash = crash

    def sample(self, prompts, languages, keys, *, k=None, greedy=False):
        if keys[0] in self.crash:
            raise ValueError("text input must be of type `str`")
        return super().sample(prompts, languages, keys, k=k, greedy=greedy)


def _stage(sampler):
    from leakray.stages.sample import ExtraColumns, SampleStage

    stage = SampleStage.__new__(SampleStage)
    stage.sampler, stage.extra, stage.ref_sampler, stage.alt_sampler = sampler, ExtraColumns(), None, None
    return stage


def test_a_prompt_that_crashes_the_sampler_fails_its_row_alone(tmp_path):
    import pyarrow.parquet as pq

    from leakray.stages.collect import collection_stats
    from leakray.stages.score import score_stage

    tasks = _tasks(3)
    sampled = _stage(_CrashingSampler(2, {"HumanEval/0"}))(input_table(tasks, {}, set()))
    notes = dict(zip(sampled.column(C.TASK_ID).to_pylist(), sampled.column(C.NOTES).to_pylist()))
    assert notes["HumanEval/0"] == ["failed:sample_error:ValueError"]  # the reason, no prompt text
    assert notes["HumanEval/2"] == ["ref_mu_sigma_unavailable", "prompt_truncated_left"]
    assert sampled.column(C.COMPLETIONS).to_pylist()[2] == ["    return 1\n"] * 2
    out = finalize(score_stage(ExecuteStage(timeout_s=10, threads=2)(sampled)), tmp_path / "errors.parquet")
    assert out.column(C.TASK_ID).to_pylist() == ["HumanEval/2"]  # HumanEval/1 failed at its endpoint
    errors = pq.read_table(tmp_path / "errors.parquet").column(C.TASK_ID).to_pylist()
    assert errors == ["HumanEval/0", "HumanEval/1"]
    stats = collection_stats(out, 1.0, tmp_path / "errors.parquet")
    assert stats["errors"]["failed:sample_error:ValueError"] == 1


def test_a_collection_whose_rows_all_fail_is_refused(tmp_path):
    import pytest

    from leakray.stages.collect import AllRowsFailed

    tasks = _tasks(3)
    crash_all = _stage(_CrashingSampler(2, {t[T.TASK_ID] for t in tasks}))
    one_batch = crash_all(input_table(tasks[:2], {}, set()))
    # a batch whose rows all failed has the columns of any other batch (its part file must read back)
    assert one_batch.schema.equals(_stage(_FlakySampler(2))(input_table(tasks[:2], {}, set())).schema)
    table = pa.concat_tables([one_batch, crash_all(input_table(tasks[2:], {}, set()))])
    with pytest.raises(AllRowsFailed, match="every row.*3 rows.*errors.parquet.*failed:sample_error:ValueError x3"):
        finalize(table, tmp_path / "errors.parquet")
    assert pq_rows(tmp_path / "errors.parquet") == 3  # written first: the reasons are there to read


def pq_rows(path) -> int:
    import pyarrow.parquet as pq

    return pq.read_table(path).num_rows


def _with_completions(tasks, completions):
    table = input_table(tasks, {}, set())
    table = table.append_column(C.COMPLETIONS, pa.array(completions, pa.list_(pa.string())))
    table = table.append_column(C.N_TOKENS, pa.array([[3] * len(c) for c in completions], pa.list_(pa.int32())))
    return table.append_column(C.PERPLEXITY, pa.array([[2.0] * len(c) for c in completions], pa.list_(pa.float32())))


def test_a_program_that_crashes_the_sandbox_harness_goes_to_the_errors_file(tmp_path):
    from leakray.stages.collect import collection_stats
    from leakray.stages.score import score_stage
    from leakray.schema import X

    tasks = _tasks(3)
    good = [continuation(t[T.PROMPT], t[T.REFERENCE]) for t in tasks]
    stage = ExecuteStage(timeout_s=10, threads=2)
    real, calls = stage.sandbox._run_plan, []

    def run_plan(rid, plan):  # the host's own code fails: always for one run, once for another
        calls.append(rid)
        if rid == "HumanEval/1#0" or (rid == "HumanEval/2#1" and calls.count(rid) == 1):
            raise OSError("No space left on device")
        return real(rid, plan)
    stage.sandbox._run_plan = run_plan
    res = stage.sandbox.run({X.ID: "HumanEval/1#0", X.LANGUAGE: "python", X.PROGRAM: "x = 1\n", X.TESTS: ""})
    assert res[X.STATUS] == "error" and res[X.HARNESS_ERROR] == "OSError"
    # a program cannot pose as the harness: its own error, whatever it prints, carries no marker
    fake = stage.sandbox.run({X.ID: "p", X.LANGUAGE: "python", X.TESTS: "",
                              X.PROGRAM: "import sys\nprint('leakray sandbox: OSError', file=sys.stderr)\n1/0\n"})
    assert fake[X.STATUS] == "failed" and X.HARNESS_ERROR not in fake
    calls.clear()

    nul = good[0].replace("return", "\x00return", 1)  # the model's own garbage: an error, not a harness fault
    table = stage(_with_completions(tasks, [[good[0], nul], [good[1], good[1]], [good[2], good[2]]]))
    assert calls.count("HumanEval/1#0") == 2 and calls.count("HumanEval/2#1") == 2  # each retried once
    assert calls.count("HumanEval/1#1") == 1 and "HumanEval/0#1" not in calls
    notes = table.column(C.NOTES).to_pylist()
    assert notes == [[], ["failed:sandbox_harness:OSError"], []]
    assert table.column(C.EXEC_STATUS).to_pylist()[0] == ["passed", "error"]
    assert table.column(C.PASSED).to_pylist()[2] == [True, True]  # the retry went through
    out = finalize(score_stage(table), tmp_path / "errors.parquet")
    assert out.column(C.TASK_ID).to_pylist() == ["HumanEval/0", "HumanEval/2"]
    assert out.column(C.PASSED).to_pylist() == [[True, False], [True, True]]
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "errors.parquet").to_pylist() == [
        {C.TASK_ID: "HumanEval/1", C.NOTES: ["failed:sandbox_harness:OSError"]}]
    stats = collection_stats(out, 1.0, tmp_path / "errors.parquet")
    assert stats["errors"] == {"failed:sandbox_harness:OSError": 1}
    assert stats["exec_status"] == {"passed": 3, "error": 1}


def test_fault_barrier_is_a_no_op_unless_set_and_holds_until_released(tmp_path, monkeypatch):
    import os
    import threading
    import time

    from leakray.stages import rows

    monkeypatch.delenv(rows.FAULT_BARRIER_ENV, raising=False)
    rows.fault_barrier("SampleStage")  # unset: returns at once, writes nothing
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setenv(rows.FAULT_BARRIER_ENV, str(tmp_path))
    held = threading.Thread(target=rows.fault_barrier, args=("EmbedStage",))
    held.start()
    ready = tmp_path / f"ready-EmbedStage-{os.getpid()}"
    end = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert ready.exists()
    time.sleep(0.3)
    assert held.is_alive()  # waiting for its release
    (tmp_path / "release-EmbedStage").touch()
    held.join(5)
    assert not held.is_alive()
    rows.fault_barrier("EmbedStage")  # released: passes without waiting


def test_chain_builds_each_step_once_and_applies_them_in_order():
    from leakray.stages.base import BatchStep, chain

    built = []

    class Tag:
        def __init__(self, tag):
            built.append(tag)
            self.tag = tag

        def __call__(self, batch):
            return batch + [self.tag]

    step = chain(BatchStep(Tag, {"tag": "a"}), BatchStep(lambda b: b + ["f"]), BatchStep(Tag, {"tag": "b"}))
    assert step.stateful
    fn = step.build()
    assert fn([]) == ["a", "f", "b"] and fn([0]) == [0, "a", "f", "b"] and built == ["a", "b"]


def test_the_encoder_runs_in_the_sampler_workers_or_in_a_pool_of_its_own():
    from dataclasses import replace

    from leakray.stages.base import Chain, StageResources
    from leakray.stages.collect import collect_steps, embed_device
    from leakray.stages.embed import EmbedStage
    from leakray.stages.sample import SampleStage
    from leakray.stages.score import score_stage

    cfg = CollectConfig(sample_resources=StageResources(2, 1.0, 1.0), embed_resources=StageResources(3, 0.0, 0.0))
    fused = collect_steps("model", cfg)
    assert [s.fn for s in fused] == [Chain, ExecuteStage, score_stage]
    assert [s.fn for s in fused[0].kwargs["steps"]] == [SampleStage, EmbedStage]
    assert fused[0].resources == cfg.sample_resources  # the sampler's pool, the sampler's GPU
    assert embed_device(cfg) == "cuda"
    apart = replace(cfg, embed_with_sampler=False)
    assert [s.fn for s in collect_steps("model", apart)] == [SampleStage, ExecuteStage, score_stage, EmbedStage]
    assert collect_steps("model", apart)[-1].resources.actors == 3 and embed_device(apart) == "cpu"


def test_embed_actors_zero_puts_the_encoder_in_the_sampler_actors():
    from leakray.config import SimulateConfig
    from leakray.protocols.simulate import collect_config

    assert collect_config(SimulateConfig()).embed_with_sampler  # the default
    own = collect_config(SimulateConfig.model_validate({"ray": {"embed_actors": 2}}))
    assert not own.embed_with_sampler and own.embed_resources.actors == 2


def test_embedding_a_batch_with_a_failed_row_keeps_the_others():
    """A row whose sampling failed carries no AdvPrompt completions (None) until finalize drops it;
    the encoder step must pass it through, not fail the whole batch (found in the audit matrix: an
    endpoint row that failed stopped a 164-task collection)."""
    import numpy as np
    import pyarrow as pa

    from leakray.schema import C
    from leakray.stages.embed import EmbedStage

    class Stub:  # one vector per text, its length as its value: which text went where is checkable
        def embed(self, texts):
            return np.array([[float(len(t)), 1.0] for t in texts])

    stage = EmbedStage.__new__(EmbedStage)
    stage.embedder = Stub()
    prompt = "def f():\n"
    batch = pa.table({C.PROMPT: [prompt, prompt], C.LANGUAGE: ["python", "python"],
                      C.REFERENCE: [prompt + "    return 1\n", prompt + "    return 2\n"],
                      C.COMPLETIONS: [["    return 1\n"], [""]],
                      C.ADV_PROMPTS: [[prompt, ""], [prompt, prompt]],
                      C.ADV_COMPLETIONS: [["    return 11\n", ""], None]})
    out = stage._embed(batch).to_pydict()
    assert out[C.ADV_EMBEDDING][1] is None and len(out[C.GEN_EMBEDDING]) == 2
    first = out[C.ADV_EMBEDDING][0]
    assert len(first) == 4 and first[0] > 0 and first[2:] == [0.0, 0.0]  # a missing variant embeds as zeros


@pytest.mark.parametrize("notes,retry", [
    (["endpoint_failed:http_429"], True), (["endpoint_failed:http_503"], True), (["endpoint_failed:timeout"], True),
    (["endpoint_failed:connection", "ref_mu_sigma_unavailable"], True), (["endpoint_failed:malformed_json"], True),
    (["failed:sample_error:ProbeFailed:http_429"], True), (["failed:sandbox_harness:OSError"], True),
    (["endpoint_failed:http_400"], False), (["endpoint_failed:http_401"], False),
    (["failed:sample_error:ProbeFailed:http_404"], False), (["failed:sample_error:ValueError"], False),
    (["failed:sample_error:ProbeFailed"], False), (["failed:sampler_returned_wrong_k"], False),
    (["endpoint_failed:http_429", "failed:sample_error:ValueError"], False), ([], False),
    (["prompt_truncated_left"], False)])
def test_which_failed_rows_another_attempt_can_cure(notes, retry):
    from leakray.stages.rows import row_retryable

    assert row_retryable(notes) is retry


def test_a_probe_failure_names_the_endpoints_reason_not_the_prompt():
    from leakray.models.endpoint_sampler import ProbeFailed
    from leakray.stages.rows import failure_note

    assert failure_note(ProbeFailed("HumanEval/3#cut12", "http_429")) == "failed:sample_error:ProbeFailed:http_429"
    assert failure_note(ValueError("def secret_prompt(): ...")) == "failed:sample_error:ValueError"


def test_a_row_that_failed_for_a_cure_able_reason_is_collected_again(tiny_lm, tmp_path):
    """Through the endpoint backend, its own retries off: one task's first sampling request gets a
    429 (its row fails), another task is refused (400) every time. The pass over failed rows
    collects the first again, where it goes through with the very output an undisturbed run
    gives (its seed is the task's); the refused one is not asked again and stays in the errors file."""
    import pyarrow.parquet as pq

    from leakray.data.tasks import generation_prompt
    from leakray.models.endpoint_server import CompletionServer, HFBackend

    tasks = [t for i, t in enumerate(_tasks(4)) if i != 1]  # HumanEval/1 is longer than the tiny model's context
    flaky, refused = (generation_prompt(t[T.PROMPT]) for t in tasks[1:])
    seen: dict[str, int] = {}

    def fault(body, _count):
        if body.get("echo"):  # reference scoring: served
            return None
        seen[body["prompt"]] = seen.get(body["prompt"], 0) + 1
        return "400" if body["prompt"] == refused else "429" if body["prompt"] == flaky and seen[flaky] == 1 else None

    hook = [None]  # one server for the three collections below, its faults switched between them

    def run(faults, rows, **kw):
        hook[0] = faults
        sample = SampleConfig(backend="openai", endpoint_url=srv.url, k=2, max_new_tokens=16, batch_size=3,
                              max_retries=0, backoff_s=0.0, row_retry_wait_s=0.0, **kw)
        retried = {}
        out = collect(input_table(rows, {}, set()), "tiny", CollectConfig(sample=sample, batch_size=3),
                      engine="local", errors_path=tmp_path / "errors.parquet", retried=retried)
        return out, retried

    with CompletionServer(HFBackend(str(tiny_lm[0])), fault=lambda body, n: hook[0] and hook[0](body, n)) as srv:
        clean, _ = run(None, tasks[1:2])  # the flaky task, undisturbed
        out, retried = run(fault, tasks)
        errors = pq.read_table(tmp_path / "errors.parquet").column(C.TASK_ID).to_pylist()
        asked = dict(seen)
        seen.clear()  # switched off, the failed row stays failed
        lost, not_retried = run(fault, tasks[:2], row_retries=0)
    assert out.column(C.TASK_ID).to_pylist() == [tasks[0][T.TASK_ID], tasks[1][T.TASK_ID]]
    assert retried == {"rows": 1, "recovered": 1}
    assert asked == {generation_prompt(tasks[0][T.PROMPT]): 1, flaky: 2, refused: 1}
    assert out.column(C.COMPLETIONS).to_pylist()[1] == clean.column(C.COMPLETIONS).to_pylist()[0]
    assert errors == [tasks[2][T.TASK_ID]]
    assert lost.column(C.TASK_ID).to_pylist() == [tasks[0][T.TASK_ID]] and not_retried == {"rows": 0, "recovered": 0}
    # the endpoint's request counters are its traffic, not rows' errors (reports list the errors)
    from leakray.stages.collect import collection_stats

    stats = collection_stats(out, 1.0)
    assert not {"requests", "retries", "failed_rows"} & set(stats["errors"])
    assert stats["endpoint_rows"]["requests"] == 2  # rows that sent requests (the kept ones)


def test_a_reference_the_endpoint_will_not_score_keeps_its_row(tiny_lm, tmp_path):
    """HumanEval/1's prompt and solution are longer than the tiny model's context: the server
    refuses to score them (400, as vLLM refuses), while its samples come back. The row stays in
    the collection with no reference loss and says why, as the HF sampler's rows stay where it
    must cut the context; before, the refusal failed the whole row."""
    import math

    from leakray.models.endpoint_server import CompletionServer, HFBackend

    tasks = _tasks(2)
    with CompletionServer(HFBackend(str(tiny_lm[0]))) as srv:
        sample = SampleConfig(backend="openai", endpoint_url=srv.url, k=2, max_new_tokens=16, batch_size=2,
                              max_retries=0, row_retry_wait_s=0.0)
        out = collect(input_table(tasks, {}, set()), "tiny", CollectConfig(sample=sample, batch_size=2),
                      engine="local", errors_path=tmp_path / "errors.parquet")
    rows = {r[C.TASK_ID]: r for r in out.to_pylist()}
    assert sorted(rows) == ["HumanEval/0", "HumanEval/1"]
    long = rows["HumanEval/1"]
    assert math.isnan(long[C.REF_LOSS]) and "ref_loss_unscorable:http_400" in long[C.NOTES]
    assert len(long[C.COMPLETIONS]) == 2 and not math.isnan(rows["HumanEval/0"][C.REF_LOSS])


def test_an_endpoint_that_answers_no_row_is_not_asked_again(tiny_lm, tmp_path):
    """Every row fails with a 503 (an endpoint that is down): a systemic fault, reported at once
    (`AllRowsFailed`), not after another pass over every row."""
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.stages.collect import AllRowsFailed

    with CompletionServer(HFBackend(str(tiny_lm[0])), fault=lambda body, _: "503") as srv:
        sample = SampleConfig(backend="openai", endpoint_url=srv.url, k=2, max_new_tokens=16, batch_size=2,
                              max_retries=0, row_retry_wait_s=0.0)
        with pytest.raises(AllRowsFailed, match="endpoint_failed:http_503"):
            collect(input_table(_tasks(2), {}, set()), "tiny", CollectConfig(sample=sample, batch_size=2),
                    engine="local", errors_path=tmp_path / "errors.parquet")
        sampled = srv.count(lambda b: not b.get("echo"))
    assert sampled == 2  # one request per task, none again


def test_a_killed_collection_reads_back_its_rows_and_asks_only_for_the_rest(tiny_lm, tmp_path, monkeypatch):
    """A collection through the endpoint (each answer a request, on a paid API money) dies in its
    second batch. The next attempt of the stage (the same key) reads the first batch's rows back
    from the part files it kept and asks the endpoint only for the other tasks; every row is the
    row an undisturbed run gives (each task's seed is its own). A part file the kill cut short is
    skipped, and rows kept under another key (other settings) are never read."""
    import pyarrow.parquet as pq

    from leakray.data.tasks import generation_prompt
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.protocols.collection import collect_to
    from leakray.runs import KEPT, StageRunner, StageSpec
    from leakray.stages import execute as stages

    tasks = [t for i, t in enumerate(_tasks(5)) if i != 1]  # HumanEval/1 is longer than the tiny model's context
    asked: list[str] = []
    served: list[dict] = []  # every request the server answered, reference scoring (echo) included

    class Quiet:
        verbose = False

        def stage(self, *args):
            pass

    def seen(body, _):
        served.append(body)
        if not body.get("echo"):
            asked.append(body["prompt"])

    with CompletionServer(HFBackend(str(tiny_lm[0])), fault=seen) as srv:
        sample = SampleConfig(backend="openai", endpoint_url=srv.url, k=2, max_new_tokens=16, batch_size=2,
                              max_retries=0, row_retry_wait_s=0.0)
        cfg = CollectConfig(sample=sample, batch_size=2)

        def spec(key):
            return StageSpec("collect_target", lambda out: collect_to(input_table(tasks, {}, set()), "tiny", cfg, out,
                                                                      engine="local"), key=key, resumable=True)

        clean = collect(input_table(tasks, {}, set()), "tiny", cfg, engine="local")
        once = len(served)  # one collection's requests, each answered the first time
        asked.clear()
        served.clear()
        run_dir, calls = tmp_path / "run", []
        real = stages.ExecuteStage.__call__

        def dies_in_the_second_batch(self, batch):
            calls.append(batch.num_rows)
            if len(calls) == 2:
                raise KeyboardInterrupt  # the driver killed mid-stage
            return real(self, batch)

        monkeypatch.setattr(stages.ExecuteStage, "__call__", dies_in_the_second_batch)
        with pytest.raises(KeyboardInterrupt):
            StageRunner(run_dir, Quiet()).run([spec("k1")])
        monkeypatch.setattr(stages.ExecuteStage, "__call__", real)
        kept = run_dir / "collect_target" / KEPT
        (written,) = kept.glob("k1/*/parts/*.parquet")  # the first batch's rows
        assert len(asked) == 4  # two tasks' samples, then the second batch's, lost with the kill
        (written.parent / "cut.parquet").write_bytes(written.read_bytes()[:200])  # a write the kill cut short
        (kept / "k0" / "a" / "parts").mkdir(parents=True)  # another key's rows: never read
        pq.write_table(pq.read_table(written).slice(0, 1), kept / "k0" / "a" / "parts" / "x.parquet")
        asked.clear()
        info = StageRunner(run_dir, Quiet()).run([spec("k1")])["collect_target"]
    first = {generation_prompt(t[T.PROMPT]) for t in tasks[:2]}
    assert len(asked) == 2 and not first & set(asked)  # only the two tasks the kill lost were asked for
    assert info["resumed_rows"] == 2 and info["rows_out"] == 4
    out = pq.read_table(run_dir / "collect_target" / "collection.parquet")
    assert out.column(C.TASK_ID).to_pylist() == clean.column(C.TASK_ID).to_pylist()
    assert out.column(C.COMPLETIONS).to_pylist() == clean.column(C.COMPLETIONS).to_pylist()
    assert not kept.exists()  # a finished stage keeps no attempt's files
    # what the endpoint was asked for, both attempts: the server's own count, and the tokens it reported
    usage = info["endpoint_usage"]
    assert usage["requests"] == len(served) and usage["retries"] == 0 and usage["workers"] == 2
    assert usage["planned"] == once < len(served)  # the plan's count: the table collected once
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_lm[0]))
    assert usage["prompt_tokens"] == sum(len(tok(b["prompt"])["input_ids"]) for b in served)
    assert 0 < usage["completion_tokens"] <= sum(b.get("max_tokens", 16) * b.get("n", 1) for b in served)


def test_a_collections_console_line_says_in_words_what_its_programs_did():
    from leakray.protocols.collection import summary_line

    info = {"rows_out": 82, "exec_status": {"error": 385, "passed": 12, "failed": 13, "timeout": 0},
            "parse_failures": {"prediction_syntax_error": 385}, "resumed_rows": 40}
    assert summary_line(info, parse_failures=True) == (
        "82 tasks (40 of them read back from a killed attempt), 410 programs: 12 passed, 13 failed their tests, "
        "385 raised or did not compile; CodeBLEU could not parse 385 (prediction_syntax_error)")
    assert summary_line({"rows_out": 8, "exec_status": {"passed": 16}, "parse_failures": {"x": 1}}) == \
        "8 tasks, 16 programs: 16 passed"  # the audit's line leaves CodeBLEU out
    assert summary_line({"rows_out": 0}) == "0 tasks"


def test_a_stage_run_by_ray_datas_wrapper_keeps_its_fault_barrier_name(monkeypatch):
    """Ray Data runs a class step as a subclass of it (`_SingleThreadedWrapper`): the fault tests wait
    for the barrier of the stage's own name."""
    from leakray.stages import rows
    from leakray.stages.embed import EmbedStage

    seen = []
    monkeypatch.setattr(rows, "fault_barrier", seen.append)
    for cls, work in ((ExecuteStage, "_execute"), (EmbedStage, "_embed")):
        stage = object.__new__(type("_SingleThreadedWrapper", (cls,), {}))  # built without its sandbox/encoder
        stage._load_s = 0.0
        setattr(stage, work, lambda batch: batch)
        out = stage(pa.table({C.TASK_ID: ["a"]}))
        assert out.column(C.PART_SECONDS).to_pylist()[0] is not None
    assert seen == ["ExecuteStage", "EmbedStage"]
