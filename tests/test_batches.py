"""The batch runner on Ray Data (`executor.batches.run_on_ray`): a batch that takes longer than
Ray Data's no-progress window is waited for, not failed with the stage's finished batches."""

from __future__ import annotations

import sys
import time

import pyarrow as pa
import pytest


class _Slow:
    """A step whose batch takes ``seconds``: a rate-limited endpoint's, scaled down."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(self.seconds)
        return batch


@pytest.mark.slow
def test_a_batch_slower_than_ray_datas_no_progress_window_is_waited_for(tmp_path, monkeypatch):
    import ray
    from ray import cloudpickle
    from ray.data import DataContext
    from ray.data.exceptions import ExecutionTimeoutError

    from leakray.executor.batches import run_on_ray
    from leakray.executor.runtime import NO_PROGRESS_ENV
    from leakray.stages.base import BatchStep, StageResources

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import tests/
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
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
        if started:
            ray.shutdown()
