"""`leakray execute` (the JSONL contract) and the Ray Data execute stage."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import local_ray

from leakray.cli import main
from leakray.schema import X

GOOD = {"id": "good", "language": "python", "program": "def f():\n    return 1\n", "tests": "assert f() == 1\n"}
BAD = {"id": "bad", "language": "python", "program": "def f():\n    return 2\n", "tests": "assert f() == 1\n"}
SLOW = {"id": "slow", "language": "python", "program": "while True:\n    pass\n", "tests": "", "timeout_s": 1}
EXIT = {"id": "exit", "language": "python", "runner": "python", "program": "import os\nos._exit(0)\n",
        "tests": "assert False\n"}


def test_execute_cli_contract(tmp_path, capsys):
    inp, out = tmp_path / "rows.jsonl", tmp_path / "results.jsonl"
    lines = [json.dumps(GOOD), "{not json", json.dumps(BAD), json.dumps({"language": "python"}),
             json.dumps(SLOW), "", json.dumps(EXIT), json.dumps({"id": "lang", "language": "cobol",
                                                                 "program": "", "tests": ""})]
    inp.write_text("\n".join(lines) + "\n")
    assert main(["execute", "--input", str(inp), "--output", str(out), "--workers", "3"]) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {r["id"]: r for r in results}
    assert len(results) == len(by_id) == 7  # exactly one per input line with content
    for r in results:
        assert set(r) - {X.HARNESS_ERROR} == {"id", "status", "passed", "duration_s", "stdout_tail", "stderr_tail"}
        # the host's marker: on the requests it refused, never on a program's own outcome
        assert r.get(X.HARNESS_ERROR) == ("BadRequest" if r["id"] in ("lang", "line:2", "line:4") else None), r
        assert r["status"] in X.STATUSES and isinstance(r["passed"], bool)
    assert by_id["good"]["status"] == "passed" and by_id["good"]["passed"] is True
    assert by_id["bad"]["status"] == "failed"
    assert by_id["slow"]["status"] == "timeout"
    assert by_id["exit"]["passed"] is False
    assert by_id["lang"]["status"] == "error"
    assert by_id["line:2"]["status"] == "error" and "line 2" in by_id["line:2"]["stderr_tail"]
    assert by_id["line:4"]["status"] == "error" and "line 4" in by_id["line:4"]["stderr_tail"]


def test_execute_cli_timeout_flag(tmp_path, monkeypatch):
    import leakray.sandbox as sandbox

    given = []

    class Recording(sandbox.Sandbox):
        def __init__(self, cfg):
            given.append(cfg.timeout_s)
            super().__init__(cfg)

    monkeypatch.setattr(sandbox, "Sandbox", Recording)
    inp, out = tmp_path / "rows.jsonl", tmp_path / "results.jsonl"
    # passes under the default 10 s; only the flag's 0.5 s times it out. Not a wall-time bound on the
    # run: a loaded machine only makes the timeout surer (a sandbox's start took 3.2 s in CI beside the
    # end-to-end runs, 7.9 s with a third test worker on 2 cores, and once a run reported 10.5 s)
    sleeper = {"id": "s", "language": "python", "program": "import time\ntime.sleep(3)\n", "tests": ""}
    inp.write_text(json.dumps(sleeper) + "\n")
    assert main(["execute", "--input", str(inp), "--output", str(out), "--timeout", "0.5"]) == 0
    res = json.loads(out.read_text())
    assert given == [0.5] and sandbox.SandboxConfig().timeout_s == 10
    assert res["status"] == "timeout"


def _batch(rows):
    cols = (X.ID, X.LANGUAGE, X.RUNNER, X.PROGRAM, X.TESTS, X.TIMEOUT_S)
    out = {c: np.array([r.get(c, "" if c != X.TIMEOUT_S else np.nan) for r in rows],
                       dtype=float if c == X.TIMEOUT_S else object) for c in cols}
    return out


def test_sandbox_actor_without_ray():
    from leakray.executor.sandbox import SandboxActor

    actor = SandboxActor({"timeout_s": 5}, threads=2)
    out = actor(_batch([GOOD, BAD, SLOW]))
    assert list(out[X.ID]) == ["good", "bad", "slow"]
    assert out[X.PASSED].dtype == bool and list(out[X.PASSED]) == [True, False, False]
    assert list(out[X.STATUS]) == ["passed", "failed", "timeout"]


@pytest.mark.slow
def test_execute_dataset_on_ray():
    import ray

    from leakray.executor.sandbox import execute_dataset

    with local_ray():
        rows = [dict(GOOD, id=f"g{i}") for i in range(5)] + [dict(BAD, id=f"b{i}") for i in range(3)]
        rows = [dict(r, runner="python", timeout_s=5.0) for r in rows]
        ds = ray.data.from_items(rows)
        got = {r[X.ID]: r for r in execute_dataset(ds, config={"timeout_s": 5}, actors=1, threads=2).take_all()}
    assert set(got) == {r["id"] for r in rows}
    assert all(bool(got[f"g{i}"][X.PASSED]) for i in range(5))
    assert not any(bool(got[f"b{i}"][X.PASSED]) for i in range(3))
