"""Run a chain of batch stages (``stages.base.BatchStep``) over a table: in-process, batch by
batch, or on Ray Data, one operator per step (an actor pool for class steps, or tasks on reused
workers where the step allows: ``reuse_workers``), streaming, with the result written as part
files and read back. The steps are the same objects either way.

Ray Data's tasks retry at least once, so a step's output rows are keyed by task id and the
caller deduplicates what comes back (``stages.collect.finalize``)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from leakray.stages.base import BatchStep

ENGINES = ("local", "ray")


def run_local(table: pa.Table, steps: Sequence[BatchStep], batch_size: int, out_dir: Path | None = None) -> pa.Table:
    """Every step in this process, each built once, over batches of ``batch_size`` rows. With
    ``out_dir``, each batch's rows are written as a part file under ``out_dir/parts`` as soon as
    the batch is done, as the Ray engine's are (what a resumable stage reads back after a kill)."""
    built = [s.build() for s in steps]
    parts, where = [], None
    if out_dir is not None:
        where = Path(out_dir) / "parts"
        where.mkdir(parents=True, exist_ok=True)
    for i, batch in enumerate(table.to_batches(max_chunksize=max(1, batch_size))):
        out = pa.Table.from_batches([batch])
        for fn in built:
            out = fn(out)
        parts.append(out)
        if where is not None:  # whole or absent: a kill mid-write leaves only the temporary name
            pq.write_table(out, where / f"part-{i:05d}.parquet.tmp")
            (where / f"part-{i:05d}.parquet.tmp").replace(where / f"part-{i:05d}.parquet")
    return pa.concat_tables(parts) if parts else table.slice(0, 0)


class _NoIdleCpuWarning(logging.Filter):
    """Ray Data warns that a dataset "will hang" when no CPU is free as it starts. Here none is
    needed: every operator but the step actors asks for 0 CPUs (see ``run_on_ray``), and the
    CPUs may still be held by the previous stage's workers while Ray releases them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "does not have any available CPUs" not in record.getMessage()


def run_on_ray(table: pa.Table, steps: Sequence[BatchStep], batch_size: int, out_dir: Path) -> pa.Table:
    """Ray Data: one ``map_batches`` operator per step, all streaming concurrently; the result
    is materialised as part files under ``out_dir/parts`` (see ``write_parts``)."""
    import ray
    from ray.data import ActorPoolStrategy, TaskPoolStrategy

    dataset_log = logging.getLogger("ray.data.dataset")
    if not any(isinstance(f, _NoIdleCpuWarning) for f in dataset_log.filters):
        dataset_log.addFilter(_NoIdleCpuWarning())

    # One block per batch, made here: a repartition would be an all-to-all operator whose tasks
    # need a CPU that the step actors may all hold.
    size = max(1, batch_size)
    blocks = [table.slice(i, size) for i in range(0, table.num_rows, size)] or [table]
    from ray.data import DataContext

    from leakray.executor.runtime import no_progress_guard_off

    no_progress_guard_off(DataContext.get_current())  # before the dataset copies the context
    ds = ray.data.from_arrow(blocks)
    for step in steps:
        res = step.resources
        opts = {"num_cpus": res.cpus}
        if res.gpus:
            opts["num_gpus"] = res.gpus
        if reuse_workers(step):
            # as many tasks at once as the pool would have had actors (the CPUs it reserves)
            opts.update(compute=TaskPoolStrategy(size=max(1, min(res.actors, len(blocks)))))
            ds = ds.map_batches(_Kept(step), batch_size=batch_size, batch_format="pyarrow", **opts)
            continue
        if step.stateful:
            # A fixed pool of the configured size: Ray Data's autoscaler budgets CPUs per operator
            # and, on a 2-CPU machine, kept the sampler at one actor of two with one core idle.
            # Safe because nothing else in the chain reserves a CPU (the other steps ask for 0,
            # and so do the writes): no operator can wait for a CPU the sampler actors hold.
            # No more actors than batches: an actor that gets no batch only pays its start-up.
            opts.update(compute=ActorPoolStrategy(size=max(1, min(res.actors, len(blocks)))),
                        fn_constructor_kwargs=step.kwargs)
        ds = ds.map_batches(step.fn, batch_size=batch_size, batch_format="pyarrow", **opts)
    return write_parts(ds, out_dir)


def reuse_workers(step: BatchStep) -> bool:
    """Whether a class step runs as Ray tasks on the cluster's reusable worker processes instead
    of an actor pool of its own: one that allows it (`StageResources.reuse_workers`: the sampler,
    `ray.reuse_workers`) and holds no GPU. Ray never gives an actor a process that ran a task, so
    each actor pool starts fresh processes, and each sampler process imports torch and
    transformers again (6.7 CPU s on a 2-core host, most of a small collection's sampler time). A
    task worker that ran the fine-tune or the previous collection has them imported. A GPU step keeps its actors:
    its pool's size is the GPUs it holds, and its model stays on the device it was loaded on."""
    return step.stateful and step.resources.reuse_workers and not step.resources.gpus


# This process's built class steps, one per class: a Ray task worker's, kept between its tasks
# while batches keep coming, let go once none came for KEEP_IDLE_S (`_Kept`).
_KEPT: dict[str, tuple[bytes, object]] = {}
_LAST_USE: dict[str, float | None] = {}  # None: a batch is running
_KEPT_LOCK = threading.Lock()
_RELEASER: list[threading.Thread] = []
# Long enough to bridge the gaps between a stage's batches (a retry pass over failed rows waits
# `sample.row_retry_wait_s`, 30 s by default), short enough that an idle worker does not hold a
# sampler's models through the detect stage. What stays is the imports: the saving.
KEEP_IDLE_S = 60.0


def drop_idle(now: float) -> list[str]:
    """Let go of the kept steps no batch has used for KEEP_IDLE_S before ``now`` (none that a
    batch is running); their names."""
    with _KEPT_LOCK:
        idle = [n for n, t in _LAST_USE.items() if t is not None and now - t > KEEP_IDLE_S]
        for name in idle:
            _KEPT.pop(name, None)
            _LAST_USE.pop(name, None)
    return idle


def _release_idle() -> None:
    while True:
        time.sleep(KEEP_IDLE_S / 4)
        drop_idle(time.monotonic())


class _Kept:
    """A class step as a task function: built by the first batch a worker process takes and kept
    for its next ones. A step of the same class built from other arguments (the next
    collection's model) replaces it, so a process holds one sampler's models at most, and the old
    one is let go before the new one loads; so is one that no batch used for KEEP_IDLE_S."""

    def __init__(self, step: BatchStep):
        import hashlib
        import pickle
        import uuid

        self.step = step
        self.name = f"{step.fn.__module__}.{step.fn.__qualname__}"
        try:  # by content: a second pass over the same steps (failed rows tried again) keeps the models
            self.key = hashlib.sha256(pickle.dumps((self.name, step.kwargs))).digest()
        except Exception:  # an argument pickle cannot write: this stage's own key
            self.key = uuid.uuid4().bytes

    def __call__(self, batch):
        with _KEPT_LOCK:
            kept = _KEPT.get(self.name)
            if kept is None or kept[0] != self.key:
                _KEPT.pop(self.name, None)
                kept = None
            _LAST_USE[self.name] = None  # in use: not released while its batch runs, however long
            if not _RELEASER:
                _RELEASER.append(threading.Thread(target=_release_idle, name="kept-step-release", daemon=True))
                _RELEASER[0].start()
        if kept is None:
            kept = (self.key, self.step.build())
            with _KEPT_LOCK:
                _KEPT[self.name] = kept
        try:
            return kept[1](batch)
        finally:
            with _KEPT_LOCK:
                _LAST_USE[self.name] = time.monotonic()


def run_steps(table: pa.Table, steps: Sequence[BatchStep], *, batch_size: int, engine: str = "ray",
              out_dir: Path | None = None) -> pa.Table:
    """The one entry point protocols use: ``engine`` chooses where, the steps do not know."""
    if engine == "local":
        return run_local(table, steps, batch_size, out_dir)
    if engine == "ray":
        if out_dir is None:
            raise ValueError("the ray engine writes part files: give out_dir")
        return run_on_ray(table, steps, batch_size, Path(out_dir))
    raise ValueError(f"unknown engine {engine!r}; one of {ENGINES}")


def write_parts(ds, out_dir: Path) -> pa.Table:
    """Materialise a Ray dataset as part files under ``out_dir/parts`` and read them back. Workers
    write from whatever node they run on: to the run's URI when it has one (`storage.shared_dir`),
    so a multi-node run loses no block; a local path must then be shared by the nodes."""
    from leakray.storage import clear_dir, shared_dir

    parts, filesystem = shared_dir(out_dir / "parts")
    clear_dir(parts, filesystem)  # a killed attempt's part files must not be read back
    ds.write_parquet(parts, filesystem=filesystem, ray_remote_args={"num_cpus": 0})  # see run_on_ray
    return pq.read_table(parts, filesystem=filesystem)
