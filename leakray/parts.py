"""Where a stage's time goes, in the form every stage marker carries: ``part_seconds`` (each
part's seconds, summed over the processes that did it, so parts that ran side by side overlap in
wall time) and ``throughput`` (work per second of the part that did it).

The collections time their parts per row (`stages.rows.PARTS`); the other stages time theirs with
a `PartClock`: a fine-tune its load, train and save, the perturb stage its generate and prove, the
detect stage its fit, threshold, score and metrics. `leakray demo` and the report read the same two
keys (`protocols.engine.time_line`, the report's stage table)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Mapping


class PartClock:
    """Seconds per named part, accumulated over any number of ``with clock.part(name):`` blocks, or
    for code that goes from one part to the next, ``clock.switch(name)`` (ends the running part,
    starts ``name``) and ``clock.stop()``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}  # work items per part, where a part counts them (`count`)
        self._running: tuple[str, float] | None = None

    def switch(self, name: str) -> None:
        self.stop()
        self._running = (name, time.perf_counter())

    def stop(self) -> None:
        if self._running is not None:
            name, t0 = self._running
            self._running = None
            self.add(name, time.perf_counter() - t0)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)

    def count(self, name: str, n: int) -> None:
        """``n`` more items done in part ``name`` (texts scored, rows written): its throughput's numerator."""
        self.counts[name] = self.counts.get(name, 0) + int(n)

    def merge(self, other: Mapping[str, float] | None) -> None:
        """Add another clock's (or a marker's) part seconds to these."""
        for name, s in (other or {}).items():
            self.add(name, s)

    def rounded(self) -> dict[str, float]:
        return {name: round(s, 2) for name, s in self.seconds.items()}


def per_second(count: float, seconds: float | None) -> float | None:
    """``count`` per second of ``seconds``; None where nothing was timed (a part that took no time
    has no throughput, rather than an infinite one)."""
    return round(count / seconds, 1) if seconds and seconds > 0 else None


def timed(fn, *args):
    """``fn(*args, clock=clock)`` with a fresh clock, wherever it runs (here, or in a Ray task
    whose clock would not come back): its result, and the clock's seconds and counts."""
    clock = PartClock()
    result = fn(*args, clock=clock)
    return result, {"seconds": clock.seconds, "counts": clock.counts}


def training_parts(clock: PartClock, tokens: int, steps: int) -> dict:
    """A training run's marker entries (a fine-tune, a pretraining mixture, a base pretrained from
    scratch): its parts, the tokens it trained on, and the train part's throughput."""
    train_s = clock.seconds.get("train")
    return {"part_seconds": clock.rounded(), "trained_tokens": tokens,
            "throughput": {"trained_tokens_per_s": per_second(tokens, train_s), "steps_per_s": per_second(steps, train_s)}}
