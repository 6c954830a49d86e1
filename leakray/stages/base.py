"""What a batch stage is, as data an executor can run: a function or a class (built once per
worker, for state that is costly to build: a model, a sandbox pool, an encoder) applied to a
pyarrow batch, with the resources one worker of it needs. The stage never says where it runs;
``leakray.executor.batches`` runs the same steps in-process or as Ray Data operators."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class StageResources:
    actors: int = 1  # at most this many workers of a class stage (an actor pool on Ray)
    cpus: float = 1.0
    gpus: float = 0.0
    # a class stage on CPUs may run as tasks on the cluster's reusable worker processes, built once
    # per process and kept for its next batches, instead of an actor pool of its own
    # (`executor.batches.reuse_workers`); for state a new configuration can replace (a model), not
    # for processes and threads of the stage's own (a sandbox pool)
    reuse_workers: bool = False


@dataclass
class BatchStep:
    """``fn(batch) -> batch``; a class is built as ``fn(**kwargs)`` once per worker and then
    called per batch, a function is called as ``fn(batch)``."""

    fn: type | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    resources: StageResources = field(default_factory=StageResources)

    @property
    def stateful(self) -> bool:
        return isinstance(self.fn, type)

    def build(self) -> Callable[[Any], Any]:
        return self.fn(**self.kwargs) if self.stateful else self.fn


class Chain:
    """Several steps in one worker: each built once here, applied in order to every batch. For
    class steps whose state is cheap to add to a worker that already holds the costly part (an
    encoder beside a language model: the process has imported torch and transformers once)."""

    def __init__(self, steps: list[BatchStep]):
        self._built = [s.build() for s in steps]

    def __call__(self, batch: Any) -> Any:
        for fn in self._built:
            batch = fn(batch)
        return batch


def chain(*steps: BatchStep) -> BatchStep:
    """One step that runs ``steps`` in order in one worker, with the first step's resources."""
    return BatchStep(Chain, {"steps": list(steps)}, steps[0].resources)
