"""Sweeps without running the protocol: planning and validation, skipping and resuming cells,
the catalog (idempotent writes, history, diff). Finished cells are written by a stand-in
for `run_simulation` with the real artefacts' shapes (report.json, detect/scores.parquet);
the real protocol under SIGKILL and `ray job submit` is in tests/test_faults.py."""

import json
import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from leakray.cli import main
from leakray.errors import BadInput
from leakray.protocols import simulate
from leakray.protocols.detectors import SCORES_SCHEMA
from leakray.storage import RunStore
from leakray.protocols.sweep import catalog
from leakray.protocols.sweep.runner import run_sweep
from leakray.protocols.sweep.spec import plan


def write_spec(tmp_path, **over) -> str:
    spec = {"name": "nightly", "output_dir": str(tmp_path / "sw"),
            "base": {"set": {"benchmark.limit": 8, "columns.advprompt": False}},
            "models": [{"name": "tiny", "set": {"model.base": "tiny"}},
                       {"name": "tiny-k3", "set": ["sample.k=3"]}],
            "benchmarks": [{"name": "humaneval"}, {"name": "humaneval", "label": "he12", "set": {"benchmark.limit": 12}}],
            "detectors": ["ref_loss", "gt_match"], **over}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


class FakeSimulation:
    """Writes what a finished simulate run leaves behind; `flags` picks the flagged tasks."""

    def __init__(self, flags=lambda task_ids, det: task_ids[:2]):
        self.calls, self.flags = [], flags

    def __call__(self, cfg, console=None):
        tasks = simulate.load_tasks(cfg)
        store = RunStore(cfg.output_dir, f"{cfg.benchmark.name}-{simulate.run_id(cfg, tasks)}")
        run_dir = store.local
        self.calls.append(run_dir)
        (run_dir / "detect").mkdir(parents=True, exist_ok=True)
        ids = [t["task_id"] for t in tasks][: len(tasks) // 2]
        parts, dets = [], {}
        for det in cfg.detect.detectors:
            flagged = set(self.flags(ids, det))
            for seed in cfg.detect.seeds:
                parts.append(pa.table({"task_id": ids, "detector": [det] * len(ids), "seed": [seed] * len(ids),
                                       "score": [0.5] * len(ids), "prediction": [int(t in flagged) for t in ids],
                                       "member": [1] * len(ids)}, schema=SCORES_SCHEMA))
            dets[det] = {"auc": 0.75, "tpr_at_5fpr": 0.5, "precision": 1.0, "recall": 0.5, "mcc": 0.6,
                         "n_pos": len(ids) // 2, "n_neg": len(ids) - len(ids) // 2}
        pq.write_table(pa.concat_tables(parts), run_dir / "detect" / "scores.parquet")
        (run_dir / "report.json").write_text(json.dumps({"detectors": dets}))
        store.close()
        return run_dir


@pytest.fixture
def fake(monkeypatch):
    sim = FakeSimulation()
    monkeypatch.setattr(simulate, "run_simulation", sim)
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "test-1")
    return sim


def rows(cat):
    con = sqlite3.connect(cat)
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM results ORDER BY model, benchmark, detector")]


def test_plan_expands_validates_and_keys_by_code_version(tmp_path, monkeypatch):
    path = write_spec(tmp_path)
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "v1")
    spec, out, cells = plan(path)
    assert [(c.model, c.benchmark) for c in cells] == [("tiny", "humaneval"), ("tiny", "he12"),
                                                        ("tiny-k3", "humaneval"), ("tiny-k3", "he12")]
    assert out == tmp_path / "sw" and all(c.run_dir.parent == out / "runs" / "v1" for c in cells)
    assert cells[1].cfg.benchmark.limit == 12 and cells[2].cfg.sample.k == 3
    assert all(c.cfg.detect.detectors == ["ref_loss", "gt_match"] for c in cells)
    assert len({c.run_dir for c in cells}) == 4  # every cell its own content-addressed run
    assert [c.run_dir for c in plan(path)[2]] == [c.run_dir for c in cells]  # stable
    # command-line overrides win over the sweep file's; a new code version is a new run dir
    assert plan(path, ["benchmark.limit=16"])[2][1].cfg.benchmark.limit == 16
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "v2")
    assert all(c.run_dir.parent.name == "v2" for c in plan(path)[2])


@pytest.mark.parametrize("over, message", [
    ({"detectors": ["ref_loss", "no_such"]}, "cell tiny x humaneval: config key 'detect.detectors': unknown detector"),
    ({"models": [{"name": "a"}, {"name": "b", "set": {"sample.kk": 2}}]}, "cell b x humaneval: unknown config key 'sample.kk'"),
    ({"benchmarks": [{"name": "humaneval"}, {"name": "mbpp"}]}, "cell tiny x mbpp: config key 'benchmark'"),
    ({"models": [{"name": "a"}, {"name": "a"}]}, "label 'a' appears twice"),
    ({"modles": []}, "unknown sweep key 'modles'"),
    ({"models": [{"name": "a", "set": ["k"]}]}, "override 'k' must look like key.sub=value"),
])
def test_bad_sweep_is_one_line_before_any_cell_runs(tmp_path, fake, capsys, over, message):
    path = write_spec(tmp_path, **over)
    with pytest.raises(BadInput, match="sweep.yaml") as err:
        plan(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert main(["sweep", path]) == 2
    assert fake.calls == [] and not (tmp_path / "sw" / "catalog.sqlite").exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_rerun_skips_finished_cells_and_records_once(tmp_path, fake):
    path = write_spec(tmp_path)
    first = run_sweep(path)
    assert len(fake.calls) == 4 and len(first.ran) == 4 and first.rows_written == 8
    cat = tmp_path / "sw" / "catalog.sqlite"
    got = rows(cat)
    assert len(got) == 8  # one per cell x detector
    r = got[0]
    assert (r["model"], r["benchmark"], r["detector"]) == ("tiny", "he12", "gt_match")
    assert r["auc"] == 0.75 and r["n"] == 6 and r["code_version"] == "test-1" and r["n_flagged"] == 2
    assert json.loads(r["flagged"]) == ["HumanEval/0", "HumanEval/1"]
    assert (tmp_path / r["run_dir"]).exists()

    second = run_sweep(path)
    assert len(fake.calls) == 4 and second.skipped and not second.ran and second.rows_written == 0
    assert rows(cat) == got
    # a cell killed before its report is run again; the others are not
    (fake.calls[0] / "report.json").unlink()
    third = run_sweep(path)
    assert len(fake.calls) == 5 and third.ran == ["tiny x humaneval"] and third.rows_written == 0


def test_history_and_diff(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "test-1")
    path = write_spec(tmp_path, models=[{"name": "tiny"}], benchmarks=[{"name": "humaneval"}])
    monkeypatch.setattr(simulate, "run_simulation", FakeSimulation(lambda ids, det: ids[:2]))
    a = run_sweep(path).run
    # a new code version: new run dirs, ref_loss now flags tasks 1..2 instead of 0..1
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "test-2")
    monkeypatch.setattr(simulate, "run_simulation",
                        FakeSimulation(lambda ids, det: ids[1:3] if det == "ref_loss" else ids[:2]))
    b = run_sweep(path).run
    capsys.readouterr()
    out = ["--output", str(tmp_path / "sw")]
    assert main(["sweep", "diff", a, b, *out, "--json"]) == 0
    changes = {c["detector"]: c for c in json.loads(capsys.readouterr().out)}
    assert changes["ref_loss"]["newly_flagged"] == ["HumanEval/10"]  # task ids sort as text: 0, 1, 10, ...
    assert changes["ref_loss"]["cleared"] == ["HumanEval/0"]
    assert changes["gt_match"]["newly_flagged"] == changes["gt_match"]["cleared"] == []
    assert main(["sweep", "diff", "previous", "latest", *out]) == 0
    text = capsys.readouterr().out
    assert "nightly: tiny x humaneval x ref_loss: +1 newly flagged ['HumanEval/10'], -1 cleared ['HumanEval/0']" in text

    assert main(["sweep", "history", *out, "--detector", "ref_loss"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:5] == ["time", "sweep_run", "model", "benchmark", "detector"]
    assert len(lines) == 3 and "test-1" in lines[1] and "test-2" in lines[2]
    assert main(["sweep", "history", *out, "--model", "nope"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1
    assert main(["sweep", "history", *out, "--runs"]) == 0
    assert capsys.readouterr().out.count(" ok") == 2
    assert main(["sweep", "diff", "nonsense", "latest", *out]) == 2


def test_record_is_idempotent_and_returns_to_an_earlier_run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(simulate, "run_simulation", FakeSimulation())
    path = write_spec(tmp_path, models=[{"name": "tiny"}], benchmarks=[{"name": "humaneval"}])
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "v1")
    run_sweep(path)
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "v2")
    run_sweep(path)
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "v1")  # back: the cell is finished, but the latest row is v2's
    again = run_sweep(path)
    assert again.skipped and again.rows_written == 2
    got = rows(tmp_path / "sw" / "catalog.sqlite")
    assert [r["code_version"] for r in got if r["detector"] == "ref_loss"] == ["v1", "v2", "v1"]
    con = catalog.connect(tmp_path / "sw" / "catalog.sqlite")
    run_dir = got[0]["run_dir"]
    assert catalog.record_cell(con, "x", "nightly", "tiny", "humaneval", run_dir, "v1") == 0


def test_failed_cell_does_not_stop_the_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAKRAY_CODE_VERSION", "t")
    sim = FakeSimulation()

    def flaky(cfg, console=None):
        if cfg.benchmark.limit == 12:
            raise RuntimeError("worker lost")
        return sim(cfg, console)

    monkeypatch.setattr(simulate, "run_simulation", flaky)
    path = write_spec(tmp_path, models=[{"name": "tiny"}])
    assert main(["sweep", path]) == 1
    con = sqlite3.connect(tmp_path / "sw" / "catalog.sqlite")
    assert con.execute("SELECT status FROM sweep_runs").fetchone()[0] == "failed: tiny x he12"
    assert con.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 2


def test_a_sweep_on_a_uri_resumes_on_a_fresh_node(tmp_path, fake, monkeypatch, capsys):
    """Cells and catalog at a URI: a second driver with an empty staging area skips every cell
    (finished at the URI), records nothing twice, and `sweep history` reads the URI's catalog."""
    from leakray import storage

    uri = f"file://{tmp_path / 'bucket'}/sweeps"
    path = write_spec(tmp_path, output_dir=uri)
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "node-a"))
    first = run_sweep(path)
    assert len(first.ran) == 4 and first.rows_written == 8
    remote = tmp_path / "bucket" / "sweeps"
    assert (remote / "catalog.sqlite").is_file()
    assert len(list(remote.glob("runs/test-1/*/report.json"))) == 4
    assert len(rows(remote / "catalog.sqlite")) == 8

    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "node-b"))
    storage._SENT.clear()
    second = run_sweep(path)
    assert len(fake.calls) == 4 and len(second.skipped) == 4 and second.rows_written == 0
    assert len(rows(remote / "catalog.sqlite")) == 8
    runs = sqlite3.connect(remote / "catalog.sqlite").execute("SELECT COUNT(*) FROM sweep_runs").fetchone()[0]
    assert runs == 2  # both drivers' sweep runs are in the URI's catalog
    capsys.readouterr()
    assert main(["sweep", "history", "--output", uri]) == 0
    assert "he12" in capsys.readouterr().out
