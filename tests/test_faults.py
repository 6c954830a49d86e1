"""Faults on a real local Ray head: SIGKILL of the whole sweep driver mid-collection and
between cells, then resume; a `ray job submit` of jobs/sweep.py during which a sampler, a
sandbox and an embedding actor process are each SIGKILLed mid-stage. Tiny protocol (8 tasks, 1-layer model, k=2) so the
module stays within a few minutes on two cores."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import _submit  # the real `ray start --head` is conftest's session fixture `ray_head`

ROOT = Path(__file__).resolve().parent.parent
TINY = {  # seconds, not a measurement: what the faults need is stages, rows and markers
    "benchmark.limit": 8, "columns.advprompt": False, "columns.upper_case": False,
    "columns.reference_model": None, "detect.bootstrap": 20, "detect.trace_memory": False, "detect.seeds": [0],
    "model.tiny.vocab_size": 400, "model.tiny.n_layer": 1, "model.tiny.n_embd": 32, "model.tiny.n_head": 2,
    "model.tiny.n_positions": 512, "model.tiny.block_size": 64, "model.tiny.batch_size": 4,
    "model.tiny.max_steps": 10, "model.tiny.warmup_steps": 2, "model.tiny.corpus_mb": 0.3,
    "target.epochs": 2, "shadow.epochs": 2, "target.max_length": 256, "shadow.max_length": 256,
    "sample.k": 2, "sample.max_new_tokens": 24, "ray.sample_actors": 1,
}
DETECTORS = ["ref_loss", "gt_match", "detectleak", "min_k"]
# the collection's actor pools: sampler, sandbox, embedding (Ray Data names its actors so)
ACTORS = {stage: f"MapWorker(MapBatches({stage}))" for stage in ("SampleStage", "ExecuteStage", "EmbedStage")}


def sweep_file(tmp_path: Path, name: str, benchmarks: list[dict]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "output_dir": str(tmp_path / "out"), "base": {"set": TINY},
                                    "models": [{"name": "tiny"}], "benchmarks": benchmarks,
                                    "detectors": DETECTORS}))
    return path


def env_for(env: dict, cache: Path) -> dict:
    # the code version is pinned: a commit landing mid-test must not re-key the cells
    return dict(env, LEAKRAY_CACHE=str(cache), LEAKRAY_CODE_VERSION="faults")


def start_driver(spec: Path, gcs: str, env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "leakray.cli", "sweep", str(spec), "--address", gcs],
                            cwd=ROOT, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: the kill takes all of it


def wait_for(cond, proc: subprocess.Popen, log: Path, timeout: float = 300.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        assert proc is None or proc.poll() is None, f"driver exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting; driver log:\n{log.read_text()[-3000:]}")


def markers(root: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_text()) for p in root.rglob("_DONE.json")}


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in (out / "runs" / "faults").glob("*") if p.is_dir())


def check_collections(run_dir: Path) -> None:
    """Every input row exactly once: the collection of each role holds its two folds' tasks."""
    folds = json.loads((run_dir / "folds" / "folds.json").read_text())
    for role, wanted in (("shadow", (2, 3)), ("target", (0, 1))):
        ids = pq.read_table(run_dir / f"collect_{role}" / "collection.parquet").column("task_id").to_pylist()
        assert len(ids) == len(set(ids)), f"{run_dir.name} {role}: duplicated rows"
        assert set(ids) == {t for t, f in folds.items() if f in wanted}, f"{run_dir.name} {role}: rows lost"


def catalog_counts(out: Path) -> dict:
    con = sqlite3.connect(out / "catalog.sqlite")
    return {tuple(r[:3]): r[3] for r in con.execute(
        "SELECT model, benchmark, detector, COUNT(*) FROM results GROUP BY model, benchmark, detector")}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_driver_then_resume(ray_head, tmp_path, leakray_cache):
    _, _, gcs, env = ray_head
    env = env_for(env, leakray_cache)
    rng = random.Random(int(os.environ.get("LEAKRAY_FAULT_SEED", time.time())))
    spec = sweep_file(tmp_path, "faults", [{"name": "humaneval", "label": "he8"},
                                           {"name": "humaneval", "label": "he9", "set": {"benchmark.limit": 9}}])
    out, log = tmp_path / "out", tmp_path / "driver.log"

    # 1) SIGKILL mid-collection of the first cell
    proc = start_driver(spec, gcs, env, log)
    stage = wait_for(lambda: next((d for d in (out / "runs" / "faults").glob("*/collect_*")
                                   if not (d / "_DONE.json").exists()), None), proc, log)
    time.sleep(rng.uniform(0, 2))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (stage / "_DONE.json").exists(), "the kill landed after the collection finished"
    first = markers(out)
    assert any(k.endswith("shadow/_DONE.json") for k in first)  # fine-tuning was done before the kill

    # 2) resume; SIGKILL again as soon as the first cell's report exists (between cells)
    proc = start_driver(spec, gcs, env, log)
    wait_for(lambda: any((d / "report.json").exists() for d in run_dirs(out)), proc, log)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    second = markers(out)
    assert {k: v for k, v in second.items() if k in first} == first  # nothing finished was recomputed

    # 3) resume to the end
    proc = start_driver(spec, gcs, env, log)
    assert proc.wait(timeout=400) == 0, log.read_text()[-3000:]
    final = markers(out)
    assert {k: v for k, v in final.items() if k in second} == second
    assert len(run_dirs(out)) == 2 and all((d / "report.json").exists() for d in run_dirs(out))
    for d in run_dirs(out):
        check_collections(d)
    counts = catalog_counts(out)
    assert {bench for _, bench, _ in counts} == {"he8", "he9"}
    n_detectors = sum(len(json.loads((d / "report.json").read_text())["detectors"]) for d in run_dirs(out))
    assert len(counts) == n_detectors and set(counts.values()) == {1}, counts  # one row per cell x detector


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_job_submit_sweep_with_sampler_actor_killed(ray_head, tmp_path, leakray_cache):
    """One job, three kills: a live sampler, sandbox and embedding actor in turn, each while a
    collect stage (shadow or target) has no marker."""
    from ray.util.state import list_actors

    _, dashboard, _, env = ray_head
    spec = sweep_file(tmp_path, "job", [{"name": "humaneval", "set": {"detect.seeds": [1]}}])
    out = tmp_path / "out"
    job_env = {"LEAKRAY_CACHE": str(leakray_cache), "LEAKRAY_CODE_VERSION": "faults"}
    killed = []  # (stage class, pid, collect stage, landed mid-stage)

    def landed(cls: str) -> bool:
        return any(c == cls and mid for c, _, _, mid in killed)

    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(_submit, ray_head, ["jobs/sweep.py", str(spec)], job_env)
        # bounded: each class in turn until one kill of it landed mid-stage (at most 3 tries each)
        end = time.monotonic() + 420
        while not job.done() and time.monotonic() < end:
            todo = [c for c in ACTORS if not landed(c) and sum(k[0] == c for k in killed) < 3]
            open_stages = [d for d in out.glob("runs/faults/*/collect_*") if not (d / "_DONE.json").exists()]
            if not todo:
                break
            if not open_stages:
                time.sleep(0.3)
                continue
            cls = todo[0]
            actors = [a for a in list_actors(address=dashboard, raise_on_missing_output=False,
                                             filters=[("class_name", "=", ACTORS[cls]), ("state", "=", "ALIVE")])
                      if a.pid not in {pid for _, pid, *_ in killed}]
            if actors:
                time.sleep(1.0)  # let it take a batch
                try:
                    os.kill(actors[0].pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                # mid-stage: the stage's marker is still absent once the process is gone
                killed.append((cls, actors[0].pid, open_stages[0], not (open_stages[0] / "_DONE.json").exists()))
            time.sleep(0.3)
        proc = job.result()
    assert all(landed(c) for c in ACTORS), f"not every actor class was killed mid-stage: {killed}"
    assert "catalog" in proc.stdout and str(out / "catalog.sqlite") in proc.stdout
    (run_dir,) = run_dirs(out)
    check_collections(run_dir)
    for _, _, stage, _ in killed:
        assert (stage / "_DONE.json").exists()
        errors = pq.read_table(stage / "errors.parquet")
        assert errors.num_rows == 0, errors.to_pylist()
    assert set(catalog_counts(out).values()) == {1}
