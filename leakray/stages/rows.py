"""What every collection stage does to a batch's rows: read a column, set columns (cast to the
collection schema), add each part's time to the rows, and tell a row that failed for good from one
another attempt can cure. The stages (`sample`, `execute`, `score`, `embed`) and `collect`'s
finalising read these."""

from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import Path

import pyarrow as pa

from leakray.schema import C, collection_schema

LOG = logging.getLogger(__name__)
FAULT_BARRIER_ENV = "LEAKRAY_FAULT_BARRIER"  # tests only: see fault_barrier
FAULT_BARRIER_TIMEOUT_S = 600.0


def fault_barrier(stage: str) -> None:
    """A test hook (tests/test_faults.py), a no-op unless $LEAKRAY_FAULT_BARRIER names a
    directory: then each call of a stage writes ``ready-<stage>-<pid>`` there and waits until
    ``release-<stage>`` exists (at most FAULT_BARRIER_TIMEOUT_S), so a fault test can kill the
    stage's actor while it holds a batch, at a known point, and then let the run go on."""
    where = os.environ.get(FAULT_BARRIER_ENV)
    if not where:
        return
    barrier = Path(where)
    release = barrier / f"release-{stage}"
    if release.exists():
        return
    (barrier / f"ready-{stage}-{os.getpid()}").touch()
    end = time.monotonic() + FAULT_BARRIER_TIMEOUT_S
    while not release.exists():
        if time.monotonic() > end:
            LOG.warning("fault barrier: no %s after %.0f s; going on", release, FAULT_BARRIER_TIMEOUT_S)
            return
        time.sleep(0.1)


# Where a collection's time goes, per row: model loads (attributed to the first batch a worker
# takes), the k samples, the reference's scores (under the model and the reference models), the
# extra passes each on its own (the upper-cased prompt, the AdvPrompt variants' completions, the
# memory probes: together the demo's largest cost, each one a `columns.*` setting shrinks), the sandbox,
# CodeBLEU and the expert features, the encoder. Summed over rows: each part's busy time,
# wherever and however in parallel it ran (`collection_stats` turns them into seconds and
# throughputs).
PARTS = ("load", "sample", "reference", "upper_case", "advprompt", "probes", "execute", "score", "embed")
# a row collected before the extra passes were timed apart (read back when a collection that an
# earlier version started is resumed): its three in one
LEGACY_PARTS = ("load", "sample", "reference", "extra_passes", "execute", "score", "embed")


def row_parts(seconds: list[float]) -> tuple[str, ...]:
    """The part names of one row's part_seconds, by its length."""
    for names in (PARTS, LEGACY_PARTS):
        if len(seconds) == len(names):
            return names
    raise ValueError(f"a row's part_seconds has {len(seconds)} entries; {len(PARTS)} expected ({', '.join(PARTS)})")


def add_part_seconds(batch: pa.Table, seconds: dict[str, list[float]]) -> pa.Table:
    """Add per-row seconds to the batch's part_seconds column (created at the first step)."""
    n = batch.num_rows
    rows = pylist(batch, C.PART_SECONDS) if C.PART_SECONDS in batch.column_names else [None] * n
    rows = [list(r) if r else [0.0] * len(PARTS) for r in rows]
    for part, values in seconds.items():
        for r, v in zip(rows, values):
            r[row_parts(r).index(part)] += v
    return with_columns(batch, {C.PART_SECONDS: rows})


def take_load(stage) -> float:
    """A worker's model load time (``stage._load_s``, set by its constructor), handed out once: the
    first batch the worker takes carries it, later ones 0."""
    load, stage._load_s = getattr(stage, "_load_s", 0.0), 0.0
    return load


def run_timed(stage, name: str, part: str, work, batch: pa.Table) -> pa.Table:
    """A whole-batch step: its fault barrier ``name`` (the stage's own class name, given: Ray Data
    runs a subclass of it, `_SingleThreadedWrapper`), then ``work(batch)``, timed as ``part`` with
    the worker's pending model load (`take_load`)."""
    fault_barrier(name)
    t0, load = time.perf_counter(), take_load(stage)
    return timed_batch(part, load, t0, work(batch))


def timed_batch(part: str, load: float, t0: float, batch: pa.Table) -> pa.Table:
    """A whole-batch step's time (and a pending model load), split evenly over its rows."""
    n = max(1, batch.num_rows)
    spent = {part: [(time.perf_counter() - t0) / n] * batch.num_rows}
    if load:
        spent["load"] = [load / n] * batch.num_rows
    return add_part_seconds(batch, spent)


def pylist(batch: pa.Table, name: str) -> list:
    """A batch's column as a Python list."""
    return batch.column(name).to_pylist()


def with_columns(batch: pa.Table, columns: dict[str, list]) -> pa.Table:
    """``batch`` with ``columns`` set (replaced or appended), each cast to the collection schema's type."""
    schema = collection_schema()
    for name, values in columns.items():
        arr = pa.array(values, type=schema.field(name).type)
        idx = batch.schema.get_field_index(name)
        batch = batch.set_column(idx, name, arr) if idx >= 0 else batch.append_column(name, arr)
    return batch


def or_none(value: float) -> float | None:
    """NaN (the backend gave no value) as null: a detector that needs the column is then skipped."""
    return None if value is None or math.isnan(value) else value


def row_failed(notes) -> bool:
    """A row whose sampling failed for good (e.g. `endpoint_failed:http_500`): it is carried
    through the stages untouched and written to the errors file, never into the collection."""
    return any("failed:" in n for n in notes or [])


def failure_note(exc: Exception) -> str:
    """The note on a row whose sampling raised: the exception's type, never its message (it may
    quote the prompt), and for a probe the endpoint's reason (`ProbeFailed.reason`: http_429,
    timeout, ...), which says whether trying the row again can help."""
    from leakray.models.endpoint_sampler import ProbeFailed

    reason = exc.reason if isinstance(exc, ProbeFailed) else None
    return f"failed:sample_error:{type(exc).__name__}" + (f":{reason}" if reason else "")


# Failures another attempt can cure (the endpoint sampler's own retries are spent, the cause may
# not be): a rate limit, a timeout, a dropped connection, a server error or a garbled answer, for a
# row's sampling or for one of its probes; a sandbox harness that broke. Not a refusal (another 4xx:
# the same request is refused again) nor a crash on the row's own input: the same row fails the same way.
_TRANSIENT = re.compile(r"(?:endpoint_failed:|sample_error:ProbeFailed:)"
                        r"(?:http_(?:408|409|429|5\d\d)|timeout|connection|malformed_json)$|failed:sandbox_harness:")


def row_retryable(notes) -> bool:
    """A failed row whose every failure note is one another attempt can cure (`_TRANSIENT`)."""
    failures = [n for n in notes or [] if "failed:" in n]
    return bool(failures) and all(_TRANSIENT.search(n) for n in failures)
