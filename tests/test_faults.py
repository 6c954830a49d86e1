"""Faults on a real local Ray head, in one sweep of two cells: SIGKILL of the whole sweep driver
mid-collection and between cells, then resumed to the end by a `ray job submit` of jobs/sweep.py
during which a sampler's worker, a sandbox actor and an embedding actor are each SIGKILLed mid-stage
(held there by the collection's test barrier). Tiny protocol (8 tasks, 1-layer model, k=2) so the
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
    # the four baselines fit in the driver: as Ray tasks each driver's run would start a worker
    # importing torch for milliseconds of fitting (side-by-side tasks: tests/test_detectors_tune.py)
    "detect.parallel": False,
}
DETECTORS = ["ref_loss", "gt_match", "detectleak", "min_k"]
# the collection's workers in pipeline order: sampler (Ray tasks on reused workers, `ray.reuse_workers`),
# sandbox and embedding (actor pools)
ACTORS = ("SampleStage", "ExecuteStage", "EmbedStage")


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


def wait_for(cond, proc: subprocess.Popen, log: Path, timeout: float = 900.0):
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


def wait_held(barrier: Path, cls: str, job, timeout: float = 900.0) -> int:
    """The pid of the first ``cls`` worker held at the collection's fault barrier."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready = sorted(barrier.glob(f"ready-{cls}-*"))
        if ready:
            return int(ready[0].name.rsplit("-", 1)[1])
        if job.done():
            job.result()  # the job's own failure, if it failed
            raise AssertionError(f"the job finished without a {cls} actor reaching the fault barrier")
        time.sleep(0.2)
    raise AssertionError(f"no {cls} actor reached the fault barrier in {timeout:.0f} s")


@pytest.mark.slow
# A hang guard, not a speed check: 248 s alone on a slow 2-core host, more than 600 s in CI beside
# the other end-to-end runs (stop 27). The bench scripts measure speed.
@pytest.mark.timeout(1800)
def test_sigkill_driver_then_resume_as_a_job_whose_actors_are_killed(ray_head, tmp_path, leakray_cache):
    """One sweep of two cells, run three times: its driver SIGKILLed mid-collection of the first
    cell, then again between the cells, then resumed to the end under `ray job submit` while a
    sampler's worker, a sandbox and an embedding actor in turn are SIGKILLed in the second cell's first
    collection, each while it holds its first batch at the collection's test barrier
    ($LEAKRAY_FAULT_BARRIER), so every kill lands mid-stage by construction; then the class is
    released and the run goes on. The test fails if a finished stage is recomputed or a row is
    lost, duplicated or failed. (One sweep for both kinds of fault: a second one would fine-tune and
    collect a cell of its own for the same checks.)"""
    from leakray.stages.rows import FAULT_BARRIER_ENV

    _, _, gcs, env = ray_head
    env = env_for(env, leakray_cache)
    rng = random.Random(int(os.environ.get("LEAKRAY_FAULT_SEED", time.time())))
    # the second cell's encoder in a pool of its own (by default it runs in the sampler's workers):
    # three actor classes to kill there
    spec = sweep_file(tmp_path, "faults", [{"name": "humaneval", "label": "he8"},
                                           {"name": "humaneval", "label": "he9",
                                            "set": {"benchmark.limit": 9, "ray.embed_actors": 1}}])
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
    (first_cell,) = [d for d in run_dirs(out) if (d / "report.json").exists()]
    # the second cell had not collected yet: the job below kills workers in its collection
    assert not any(next(d.glob("collect_*"), None) for d in run_dirs(out) if d != first_cell)

    # 3) resume to the end as a job, three workers killed in the second cell's first collection
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    job_env = {"LEAKRAY_CACHE": str(leakray_cache), "LEAKRAY_CODE_VERSION": "faults", FAULT_BARRIER_ENV: str(barrier)}
    killed = []  # (stage class, pid, open collect stage)
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(_submit, ray_head, ["jobs/sweep.py", str(spec)], job_env)
        try:
            for cls in ACTORS:  # in pipeline order: each class is held until it was killed
                pid = wait_held(barrier, cls, job)
                (held,) = [d for d in out.glob("runs/faults/*/collect_*") if not (d / "_DONE.json").exists()]
                os.kill(pid, signal.SIGKILL)
                killed.append((cls, pid, held))
                (barrier / f"release-{cls}").touch()
        finally:
            for cls in ACTORS:  # never leave the job waiting at the barrier
                (barrier / f"release-{cls}").touch()
        proc = job.result()
    assert [k[0] for k in killed] == list(ACTORS), killed
    assert "catalog" in proc.stdout and str(out / "catalog.sqlite") in proc.stdout
    final = markers(out)
    assert {k: v for k, v in final.items() if k in second} == second
    assert len(run_dirs(out)) == 2 and all((d / "report.json").exists() for d in run_dirs(out))
    for d in run_dirs(out):
        check_collections(d)
    for _, _, held in killed:
        assert held.parent != first_cell and (held / "_DONE.json").exists()
        errors = pq.read_table(held / "errors.parquet")
        assert errors.num_rows == 0, errors.to_pylist()
    counts = catalog_counts(out)
    assert {bench for _, bench, _ in counts} == {"he8", "he9"}
    n_detectors = sum(len(json.loads((d / "report.json").read_text())["detectors"]) for d in run_dirs(out))
    assert len(counts) == n_detectors and set(counts.values()) == {1}, counts  # one row per cell x detector


