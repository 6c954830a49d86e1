"""The control route's one model pass: the benchmark's tasks and the control tasks (tasks the
target cannot have seen, `audit.control`) scored by the same code under the model under audit
and under the reference model, so both sets' statistics are on one footing.

Runs through the same samplers as the collection (hf, vllm, or an OpenAI-compatible endpoint
that echoes log-probabilities); each model is loaded once. A text the backend could not score
keeps NaN and its reason: it is left out, and the report counts it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from leakray.data.tasks import continuation
from leakray.errors import BadInput
from leakray.evaluate.control_route import FILE
from leakray.models.sampler import SampleConfig
from leakray.parts import PartClock
from leakray.protocols.rewrite_scores import reference_scores
from leakray.schema import K, T, control_scores_schema


def load_control(spec: str, benchmark: list[dict]) -> tuple[list[dict], list[list]]:
    """Control tasks from ``NAME=PATH`` (a reader name or a label; the format is sniffed) or a
    registered benchmark name, and the ones left out. A control task that is also a benchmark task
    (same prompt or same solution) would be scored as clean while it may have leaked: refused, the
    user gave the wrong set. One whose solution nearly copies a benchmark task's may have been read
    in substance with it, which would lift the null the benchmark is tested against: left out, and
    returned as [control id, benchmark id, Jaccard] (`screen.siblings.cross_near_copies`)."""
    from leakray.data.registry import load_benchmark, load_benchmark_file
    from leakray.screen.siblings import cross_near_copies

    name, _, path = spec.partition("=")
    tasks = load_benchmark_file(name, path) if path else load_benchmark(name)
    if not tasks:
        raise BadInput("the control set holds no tasks", field="audit.control")
    prompts = {t[T.PROMPT].strip() for t in benchmark}
    solutions = {t[T.REFERENCE].strip() for t in benchmark}
    shared = [t[T.TASK_ID] for t in tasks if t[T.PROMPT].strip() in prompts or t[T.REFERENCE].strip() in solutions]
    if shared:
        raise BadInput(f"{len(shared)} control tasks are benchmark tasks too (e.g. {shared[0]}): control tasks must be "
                       "ones the target cannot have seen", field="audit.control")
    copies = cross_near_copies(tasks, benchmark)
    left_out = {c for c, _, _ in copies}
    kept = [t for t in tasks if t[T.TASK_ID] not in left_out]
    if not kept:
        raise BadInput(f"every control task nearly copies a benchmark task (e.g. {copies[0][0]} ~ {copies[0][1]}): "
                       "control tasks must be ones the target cannot have seen", field="audit.control")
    return kept, copies


def score_whole(model_path: str, sample: SampleConfig, tasks: list[dict], clock: PartClock | None = None,
                role: str = "model") -> list[tuple[float, float]]:
    """(log p(solution | prompt), log p(prompt)) of each task, NaN where the backend gave none or
    the text was cut to fit the model."""
    out = []
    pairs = [(t[T.PROMPT], t[T.REFERENCE]) for t in tasks]
    for s in reference_scores(model_path, sample, pairs, clock=clock, role=role):
        cut = not s.logprobs or any("truncated" in n for n in s.notes)
        out.append((math.nan if cut else math.fsum(s.logprobs), float(s.context_logprob)))
    return out


def control_scores(benchmark: list[dict], control: list[dict], target: str, target_sample: SampleConfig,
                   reference: str, clock: PartClock | None = None) -> pa.Table:
    """One row per task of both sets (schema K), benchmark first. ``clock`` gets each model's
    load and score (`protocols.rewrite_scores.scoring_parts`)."""
    tasks = [(t, "benchmark") for t in benchmark] + [(t, "control") for t in control]
    plain = [t for t, _ in tasks]
    tgt = score_whole(target, target_sample, plain, clock, "target")
    ref = score_whole(reference, SampleConfig(**{**target_sample.__dict__, "backend": "hf", "lora_adapter": None}),
                      plain, clock, "reference")
    rows = []
    for (t, which), (ts, tp), (rs, rp) in zip(tasks, tgt, ref):
        missing = [name for name, v in (("the target's solution", ts), ("the target's prompt", tp),
                                        ("the reference model's solution", rs), ("the reference model's prompt", rp))
                   if not math.isfinite(v)]
        rows.append({K.TASK_ID: t[T.TASK_ID], K.SET: which,
                     K.CHARS: len(t[T.PROMPT]) + len(continuation(t[T.PROMPT], t[T.REFERENCE])),
                     K.TARGET_SOLUTION: ts, K.TARGET_PROMPT: tp, K.REFERENCE_SOLUTION: rs, K.REFERENCE_PROMPT: rp,
                     K.REASON: f"no log-probabilities for {', '.join(missing)} (too long, or the backend gave none)"
                     if missing else ""})
    return pa.Table.from_pylist(rows, schema=control_scores_schema())


def write_control_scores(table: pa.Table, out: Path) -> Path:
    path = Path(out) / FILE
    pq.write_table(table, path)
    return path
