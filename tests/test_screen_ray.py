"""`leakray screen` end to end on a local Ray (one CPU): the same outputs as the in-process engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

FIX = Path(__file__).parent / "fixtures" / "screen"


@pytest.mark.slow
def test_screen_on_local_ray_matches_local_engine(tmp_path):
    ray = pytest.importorskip("ray")
    from leakray.cli import main

    corpus = tmp_path / "corpus"
    shutil.copytree(FIX / "corpus", corpus)
    shutil.copy(FIX / "corpus.jsonl", corpus / "shard.jsonl")
    he = [json.loads(line) for line in (FIX / "humaneval.jsonl").open()]
    pq.write_table(pa.table({"content": [he[1]["prompt"] + he[1]["canonical_solution"], None],
                             "path": ["repo/trunc.py", "repo/none.py"]}), corpus / "shard.parquet")
    (corpus / "broken.parquet").write_bytes(b"PAR1 garbage")
    args = ["screen", "--benchmark", f"humaneval={FIX / 'humaneval.jsonl'}", "--benchmark",
            f"mbpp={FIX / 'mbpp.jsonl'}", "--corpus", str(corpus)]
    if ray.is_initialized():  # an earlier test's in-process run left its Ray up: this test wants one CPU
        from leakray.executor.runtime import shutdown_ray

        shutdown_ray()
    ray.init(address="local", num_cpus=1, include_dashboard=False, configure_logging=False)
    try:
        assert main(args + ["--output", str(tmp_path / "ray")]) == 0
    finally:
        ray.shutdown()
    assert main(args + ["--output", str(tmp_path / "local"), "--engine", "local"]) == 0
    got = {k: json.loads((tmp_path / k / "summary.json").read_text()) for k in ("ray", "local")}
    for name in ("humaneval", "mbpp"):
        assert got["ray"]["benchmarks"][name] == got["local"]["benchmarks"][name]
    assert got["ray"]["benchmarks"]["humaneval"]["leaked_task_ids"] == [
        "HumanEval/0", "HumanEval/1", "HumanEval/2", "HumanEval/3"]
    for level in ("files", "texts"):
        assert got["ray"]["corpus"][level] == got["local"]["corpus"][level]
    assert got["ray"]["corpus"]["files"]["skipped"]["unreadable"] == 1  # broken.parquet
    assert got["ray"]["corpus"]["texts"]["skipped"]["malformed"] == 1  # a line of shard.jsonl
    assert got["ray"]["corpus"]["files"]["accounted"]
    key = ["task_id", "field", "corpus_id", "line_start", "jaccard", "containment", "span_coverage", "est_jaccard"]
    rows = {k: sorted(tuple(r[c] for c in key) for r in pq.read_table(tmp_path / k / "pairs.parquet").to_pylist())
            for k in ("ray", "local")}
    assert rows["ray"] == rows["local"]
