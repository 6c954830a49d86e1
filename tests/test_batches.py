"""The batch runner on Ray Data (`executor.batches.run_on_ray`): a batch that takes longer than
Ray Data's no-progress window is waited for, not failed with the stage's finished batches; a
class step that allows it runs on reused task workers, built once per process, not per batch
or per stage."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import local_ray


class _Slow:
    """A step whose batch takes ``seconds``: a rate-limited endpoint's, scaled down."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(self.seconds)
        return batch


class _Built:
    """A step that leaves one file per build (named by its process) and tags each row with the
    process that ran it: a model's load, observable."""

    def __init__(self, where: str, tag: str):
        self.tag = tag
        Path(where, f"built-{os.getpid()}-{tag}-{time.time_ns()}").touch()

    def __call__(self, batch: pa.Table) -> pa.Table:
        import ray

        actor = ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
        return batch.append_column("pid", pa.array([os.getpid()] * batch.num_rows)).append_column(
            "in_actor", pa.array([actor] * batch.num_rows))


def _builds(where: Path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in where.glob("built-*")]


@pytest.fixture(scope="module")
def ray_here():
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import tests/
    with local_ray():
        yield


@pytest.fixture
def no_kept():
    from leakray.executor import batches

    batches._KEPT.clear()
    batches._LAST_USE.clear()
    yield
    batches._KEPT.clear()
    batches._LAST_USE.clear()


def test_a_kept_step_is_built_once_per_configuration_and_process(tmp_path, no_kept):
    from leakray.executor.batches import _KEPT, _Kept
    from leakray.stages.base import BatchStep

    batch = pa.table({"id": [1]})
    a = BatchStep(_Built, {"where": str(tmp_path), "tag": "a"})
    for _ in range(2):  # two stages' objects, one configuration: one build
        _Kept(a)(batch)
    assert len(_builds(tmp_path)) == 1
    _Kept(BatchStep(_Built, {"where": str(tmp_path), "tag": "b"}))(batch)  # another: built, and replaces it
    assert len(_builds(tmp_path)) == 2
    (key, kept), = [v for k, v in _KEPT.items() if k.endswith("._Built")]
    assert kept.tag == "b"


def test_only_a_class_step_that_allows_it_and_holds_no_gpu_runs_on_reused_workers():
    from leakray.executor.batches import reuse_workers
    from leakray.stages.base import BatchStep, StageResources

    def step(fn=_Built, **res):
        return BatchStep(fn, {}, StageResources(**{"actors": 2, "cpus": 1.0, **res}))

    assert reuse_workers(step(reuse_workers=True))
    assert not reuse_workers(step(reuse_workers=True, gpus=1.0))  # a GPU sampler keeps its actor pool
    assert not reuse_workers(step(reuse_workers=False))  # the sandbox's, an encoder's own pool
    assert not reuse_workers(step(fn=lambda batch: batch, reuse_workers=True))  # a function: tasks anyway


def test_a_kept_step_is_let_go_when_idle_and_never_while_its_batch_runs(tmp_path, no_kept):
    import time as clock

    from leakray.executor import batches
    from leakray.stages.base import BatchStep

    seen = []

    class _Slow(_Built):  # asks for the release in the middle of its own batch
        def __call__(self, batch):
            seen.append(batches.drop_idle(clock.monotonic() + 10 * batches.KEEP_IDLE_S))
            return super().__call__(batch)

    step = batches._Kept(BatchStep(_Slow, {"where": str(tmp_path), "tag": "s"}))
    step(pa.table({"id": [1]}))
    assert seen == [[]] and step.name in batches._KEPT  # running: kept
    assert batches.drop_idle(clock.monotonic()) == [] and step.name in batches._KEPT  # just used: kept
    assert batches.drop_idle(clock.monotonic() + batches.KEEP_IDLE_S + 1) == [step.name]
    assert step.name not in batches._KEPT
    step(pa.table({"id": [2]}))  # the next batch builds it again
    assert len(_builds(tmp_path)) == 2


@pytest.mark.slow
def test_a_step_on_reused_workers_is_built_once_per_process_across_stages(tmp_path, ray_here):
    """Two runs of one sampler-like step (a collection and its pass over failed rows) on reused
    task workers: each process builds it once, whatever batches and runs it takes (an actor pool
    would build it in fresh processes for each run)."""
    from leakray.executor.batches import run_on_ray
    from leakray.stages.base import BatchStep, StageResources

    table = pa.table({"id": list(range(4))})
    step = BatchStep(_Built, {"where": str(tmp_path), "tag": "x"}, StageResources(2, 1.0, reuse_workers=True))
    runs = [run_on_ray(table, [step], 1, tmp_path / f"run{i}") for i in (1, 2)]
    assert not any(v for r in runs for v in r.column("in_actor").to_pylist())  # Ray tasks, no actor pool
    ran = [set(r.column("pid").to_pylist()) for r in runs]
    builds = _builds(tmp_path)
    assert sorted(set(builds)) == sorted(ran[0] | ran[1])  # every process that ran it built it
    assert len(builds) == len(set(builds)), builds  # once per process, across both runs


@pytest.mark.slow
def test_a_batch_slower_than_ray_datas_no_progress_window_is_waited_for(tmp_path, monkeypatch, ray_here):
    from ray.data import DataContext
    from ray.data.exceptions import ExecutionTimeoutError

    from leakray.executor.batches import run_on_ray
    from leakray.executor.runtime import NO_PROGRESS_ENV
    from leakray.stages.base import BatchStep, StageResources

    ctx = DataContext.get_current()
    before = ctx.execution_no_progress_timeout_s
    table = pa.table({"id": [1, 2, 3]})
    step = BatchStep(_Slow, {"seconds": 2.5}, StageResources(actors=1, cpus=1.0))
    try:
        monkeypatch.delenv(NO_PROGRESS_ENV, raising=False)
        ctx.execution_no_progress_timeout_s = 1  # Ray's 30 minutes, scaled as the batch is
        out = run_on_ray(table, [step], 3, tmp_path / "waited")
        assert sorted(out.column("id").to_pylist()) == [1, 2, 3]
        # where the user set Ray's own variable, its window stands
        monkeypatch.setenv(NO_PROGRESS_ENV, "1")
        ctx.execution_no_progress_timeout_s = 1
        with pytest.raises(ExecutionTimeoutError):
            run_on_ray(table, [step], 3, tmp_path / "failed")
    finally:
        ctx.execution_no_progress_timeout_s = before


def test_the_collections_sampler_follows_ray_reuse_workers():
    from leakray.config import load_config
    from leakray.executor.batches import reuse_workers
    from leakray.protocols.simulate import collect_config
    from leakray.stages.collect import collect_steps

    def sampler(*sets):
        return collect_steps("model", collect_config(load_config([], list(sets))))[0]

    assert reuse_workers(sampler())  # the default, on CPUs
    assert not reuse_workers(sampler("ray.reuse_workers=false"))
    assert not reuse_workers(sampler("ray.use_gpu=true"))
