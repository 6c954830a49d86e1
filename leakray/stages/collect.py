"""The collection's stages: sample -> execute -> score -> embed, on pyarrow batches.

Each stage is a plain class or function on a batch (one row per task), one module each
(`sample`, `execute`, `score`, `embed`; what they share is `rows`); `collect_steps` hands them
to an executor (`leakray.executor.batches`), which runs them in-process or as Ray Data operators
with actor pools where the state is heavy (a model, a sandbox pool, an encoder). Actor-pool
tasks retry at least once, so rows are keyed by task id and `finalize` deduplicates them; here
too the collection's statistics.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from leakray.models.sampler import SampleConfig
from leakray.parts import per_second
from leakray.schema import C, T, collection_schema
from leakray.stages.base import BatchStep, StageResources, chain
from leakray.stages.embed import EmbedStage
from leakray.stages.execute import ExecuteStage
from leakray.stages.rows import PARTS, row_failed, row_parts, row_retryable
from leakray.stages.sample import ExtraColumns, SampleStage
from leakray.stages.score import score_stage


@dataclass
class CollectConfig:
    sample: SampleConfig = field(default_factory=SampleConfig)
    execute_timeout_s: float = 10.0
    execute_threads: int = 4
    allow_weak_isolation: bool = False
    embed_model: str = "minilm"
    embed_max_tokens: int = 510
    embed_stride: int = 256
    embed_batch_size: int = 16
    # the sandbox's processes are outside Ray's accounting; its actors only wait on them
    sample_resources: StageResources = field(default_factory=lambda: StageResources(2, 1.0))
    execute_resources: StageResources = field(default_factory=lambda: StageResources(1, 0.0))
    embed_resources: StageResources = field(default_factory=lambda: StageResources(1, 0.0))
    embed_with_sampler: bool = True  # the encoder in the sampler's workers, no pool of its own
    batch_size: int = 8  # tasks per batch through every stage
    extra: ExtraColumns = field(default_factory=ExtraColumns)


def embed_device(cfg: CollectConfig) -> str:
    """The encoder runs where its actors were placed: on their GPU share when they have one (the
    sampler's, when it runs in the sampler's workers)."""
    placed = cfg.sample_resources if cfg.embed_with_sampler else cfg.embed_resources
    return "cuda" if placed.gpus else "cpu"


def collect_steps(model_path: str, cfg: CollectConfig, usage_to: tuple[str, object] | None = None
                  ) -> list[BatchStep]:
    """The collection as batch steps: sample -> execute -> score -> embed, or, with
    ``embed_with_sampler``, (sample + embed) -> execute -> score. ``usage_to``: where the
    samplers keep what they asked an endpoint for (`SampleStage`)."""
    sample = BatchStep(SampleStage, {"model_path": model_path, "sample": cfg.sample, "extra": cfg.extra,
                                     "usage_to": usage_to}, cfg.sample_resources)
    embed = BatchStep(EmbedStage, {"model": cfg.embed_model, "max_tokens": cfg.embed_max_tokens,
                                   "stride": cfg.embed_stride, "batch_size": cfg.embed_batch_size,
                                   "device": embed_device(cfg)}, cfg.embed_resources)
    rest = [
        BatchStep(ExecuteStage, {"timeout_s": cfg.execute_timeout_s, "threads": cfg.execute_threads,
                                 "allow_weak_isolation": cfg.allow_weak_isolation}, cfg.execute_resources),
        # light (CodeBLEU on a batch's completions): no CPU of its own to reserve; a function step runs as
        # Ray tasks, as many at once as Ray Data starts (`actors` bounds class steps' pools only)
        BatchStep(score_stage, resources=StageResources(actors=1, cpus=0.0)),
    ]
    if cfg.embed_with_sampler:
        # The encoder reads only the completions and references, so it can run right after the
        # sampler, in the sampler's own workers: an encoder pool of its own costs one more fresh
        # process per collection, and its start-up (importing torch and transformers, ~9 s of
        # CPU here) is most of a small collection's embedding time.
        return [chain(sample, embed), *rest]
    return [sample, *rest, embed]


def input_table(tasks: list[dict], folds: dict[str, int], members: set[str]) -> pa.Table:
    rows = [{
        C.TASK_ID: t[T.TASK_ID], C.BENCHMARK: t[T.BENCHMARK], C.LANGUAGE: t[T.LANGUAGE],
        C.FOLD: folds.get(t[T.TASK_ID], -1), C.MEMBER: int(t[T.TASK_ID] in members),
        C.PROMPT: t[T.PROMPT], C.REFERENCE: t[T.REFERENCE], T.TESTS: t[T.TESTS], T.RUNNER: t[T.RUNNER],
    } for t in tasks]
    schema = collection_schema()
    fields = [schema.field(n) for n in (C.TASK_ID, C.BENCHMARK, C.LANGUAGE, C.FOLD, C.MEMBER, C.PROMPT,
                                        C.REFERENCE)]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields + [pa.field(T.TESTS, pa.string()),
                                                                 pa.field(T.RUNNER, pa.string())]))


class AllRowsFailed(RuntimeError):
    """Every row of a collection failed: a systemic fault (a broken model or sandbox), not bad rows."""


def finalize(table: pa.Table, errors_path: Path | None = None) -> pa.Table:
    """One row per task (retries deduplicated), sorted, cast to the collection schema. Rows
    whose processing failed for good go to `errors_path` (task id and reasons), not the collection;
    `AllRowsFailed` when no row is left."""
    chosen: dict[str, int] = {}
    notes = table.column(C.NOTES).to_pylist() if C.NOTES in table.column_names else [[]] * table.num_rows
    for i, task_id in enumerate(table.column(C.TASK_ID).to_pylist()):
        if task_id not in chosen or (row_failed(notes[chosen[task_id]]) and not row_failed(notes[i])):
            chosen[task_id] = i  # a retry that went through beats an attempt that failed
    keep = [i for i in chosen.values() if not row_failed(notes[i])]
    failed = [i for i in chosen.values() if row_failed(notes[i])]
    if errors_path is not None:
        errs = table.take(failed).select([C.TASK_ID, C.NOTES]) if failed else \
            pa.table({C.TASK_ID: pa.array([], pa.string()), C.NOTES: pa.array([], pa.list_(pa.string()))})
        pq.write_table(errs, errors_path)
    if failed and not keep:  # an all-errors collection would only look like a run with nothing to detect
        reasons = Counter(n for i in failed for n in notes[i] or [] if "failed:" in n).most_common(3)
        raise AllRowsFailed(f"every row of the collection failed ({len(failed)} rows; ids and reasons in "
                            f"{errors_path or 'no errors file'}); top reasons: "
                            + ", ".join(f"{reason} x{count}" for reason, count in reasons))
    table = table.take(keep).sort_by(C.TASK_ID)
    schema = collection_schema()
    # optional columns a backend did not fill are all-null, never invented
    return pa.table({name: table.column(name).cast(schema.field(name).type) if name in table.column_names
                     else pa.nulls(table.num_rows, schema.field(name).type) for name in schema.names},
                    schema=schema)


def retryable_rows(table: pa.Table) -> dict[str, list[str]]:
    """The tasks of a collection's raw rows (every attempt, as `finalize` reads them) with no
    attempt that went through and a last failure another attempt can cure (`row_retryable`):
    task id -> that failure's notes."""
    notes = table.column(C.NOTES).to_pylist() if C.NOTES in table.column_names else [[]] * table.num_rows
    last: dict[str, list[str] | None] = {}
    for task_id, n in zip(table.column(C.TASK_ID).to_pylist(), notes):
        if last.get(task_id, ()) is not None:  # None: an attempt of this task went through
            last[task_id] = n if row_failed(n) else None
    return {t: n for t, n in last.items() if n is not None and row_retryable(n)}


def unfilled_columns(table: pa.Table) -> list[str]:
    """Collection columns with no value in any row (the backend could not fill them)."""
    return [name for name in table.column_names if table.num_rows and table.column(name).null_count == table.num_rows]


def collection_stats(table: pa.Table, seconds: float, errors_path: Path | None = None) -> dict:
    """Per-stage numbers the report shows: rows, execution outcomes by kind, the reasons rows
    were degraded (row notes: truncations, NaN losses, CodeBLEU failures), parse failures,
    and the rows that failed for good (in the errors file, by reason)."""
    from leakray.features.expert import PARSE_NOTES

    statuses = Counter(s for row in table.column(C.EXEC_STATUS).to_pylist() for s in row)
    n_tokens = [n for row in table.column(C.N_TOKENS).to_pylist() for n in row]
    notes = Counter(n for row in table.column(C.NOTES).to_pylist() for n in row or [])
    if errors_path is not None and Path(errors_path).exists():
        failed = pq.read_table(errors_path).column(C.NOTES).to_pylist()
        notes.update(n for row in failed for n in row or [] if "failed:" in n)
    from leakray.features.probes import PROBES

    probe_s = [row for row in table.column(C.PROBE_SECONDS).to_pylist() if row] \
        if C.PROBE_SECONDS in table.column_names else []
    traffic = {k: notes.pop(k) for k in list(notes) if is_traffic(k)}
    answers = {k: notes.pop(k) for k in list(notes) if k.startswith(CHAT_ANSWER)}
    return {
        **part_stats(table, sum(n_tokens), sum(statuses.values())),
        # rows that sent an endpoint requests, needed retries (by reason): what it cost to reach it, not
        # what is wrong with a row (a count of rows, each reason once per row, as for errors)
        **({"endpoint_rows": traffic} if traffic else {}),
        # rows whose chat answers had their wrapping taken off (`leakray.models.chat`): how the model
        # answered, not a fault of the row
        **({"chat_answers": answers} if answers else {}),
        # each probe's wall time over the collection (what it adds to the sampling pass)
        # (a collection made before the next-token probe has three entries per row, before the question
        # probe four)
        **({"probe_seconds": {p: round(sum(r[j] for r in probe_s if len(r) > j), 3) for j, p in enumerate(PROBES)}}
           if probe_s else {}),
        "rows": table.num_rows, "rows_out": table.num_rows, "completions": sum(statuses.values()),
        "unfilled_columns": unfilled_columns(table),
        # program outcomes (error = does not compile, timeout, memory) are in exec_status, not here
        "errors": {k: v for k, v in notes.items() if k not in PARSE_NOTES},
        "parse_failures": {k: v for k, v in notes.items() if k in PARSE_NOTES},
        "exec_status": dict(statuses), "mean_generated_tokens": round(sum(n_tokens) / max(1, len(n_tokens)), 1),
        "seconds": round(seconds, 1), "seconds_per_task": round(seconds / max(1, table.num_rows), 3),
    }


# The endpoint sampler's request counters (`EndpointSampler.stats`) that reach a row's notes with
# its other counters: its traffic, not a degradation (`collection_stats` keeps them apart).
TRAFFIC = ("requests", "retries", "failed_rows")
CHAT_ANSWER = "chat_answer_"  # the prefix of `leakray.models.chat`'s notes on how an answer was wrapped


def is_traffic(note: str) -> bool:
    return note in TRAFFIC or note.startswith("retry_")


def part_stats(table: pa.Table, generated_tokens: int, programs: int) -> dict:
    """Each part's busy seconds (summed over workers: parts on different workers overlap in wall
    time) and its throughput: generated tokens per sampling second, programs per sandbox second,
    solutions (k + the reference) per encoder second."""
    rows = [r for r in table.column(C.PART_SECONDS).to_pylist() if r] if C.PART_SECONDS in table.column_names else []
    if not rows:
        return {}
    busy = dict.fromkeys(PARTS, 0.0)
    for r in rows:
        for part, v in zip(row_parts(r), r):
            busy[part] = busy.get(part, 0.0) + v
    busy = {p: round(v, 2) for p, v in busy.items()}
    k = max((len(c) for c in table.column(C.COMPLETIONS).to_pylist() if c), default=0)
    per_s = lambda n, part: per_second(n, busy[part])  # noqa: E731
    return {"part_seconds": busy, "throughput": {
        "generated_tokens_per_s": per_s(generated_tokens, "sample"), "programs_per_s": per_s(programs, "execute"),
        "tasks_scored_per_s": per_s(len(rows), "score"), "solutions_embedded_per_s": per_s(len(rows) * (k + 1), "embed")}}


def write_collection(table: pa.Table, path: Path, stats: dict) -> None:
    pq.write_table(table, path)
    path.with_suffix(".stats.json").write_text(json.dumps(stats, indent=2))
