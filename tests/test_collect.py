"""The collection stages on tiny inputs, in-process (no Ray)."""

import pyarrow as pa

from leakray.data.humaneval import read_humaneval
from leakray.data.tasks import continuation
from leakray.models.sampler import SampleConfig
from leakray.pipelines.collect import CollectConfig, ExecuteStage, collect_local, finalize, input_table
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
    out = collect_local(table, str(path), cfg)
    assert out.schema.equals(collection_schema())
    assert out.column(C.TASK_ID).to_pylist() == sorted(t[T.TASK_ID] for t in tasks)
    assert out.column(C.MEMBER).to_pylist() == [1, 0, 0]
    row = out.to_pylist()[1]
    assert len(row[C.COMPLETIONS]) == len(row[C.PASSED]) == len(row[C.CODEBLEU]) == 2
    assert len(row[C.EXPERT]) == 8 and row[C.EXPERT][:2] == row[C.PERPLEXITY]
    d = len(row[C.REF_EMBEDDING])
    assert d == 384 and len(row[C.GEN_EMBEDDING]) == 2 * d
    assert row[C.REF_LOSS] > 0


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

    from leakray.pipelines.collect import SampleStage, collection_stats, score_stage

    tasks = _tasks(3)
    from leakray.pipelines.collect import ExtraColumns

    stage = SampleStage.__new__(SampleStage)
    stage.sampler, stage.extra, stage.ref_sampler = _FlakySampler(k=2), ExtraColumns(), None
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
