"""The AdvPrompt perturbation stage: every task fans out to its 11 variants,
each proven in the sandbox (variant prompt + reference continuation still passes the tests),
and folds back into one row per task: `adv_prompts` / `adv_kind` with slot 0 the original.

It depends on the benchmark and the seed only, never on a model, so it runs once per run and
both collections (shadow and target) read it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from leakray.errors import BadInput
from leakray.parts import per_second
from leakray.schema import TASK_SCHEMA, C, T
from leakray.stages.base import BatchStep, StageResources

BASE_SLOT = "base"
# a proven batch's time, split evenly over its rows in the C.PART_SECONDS column, in this order:
# writing the variants, then running each one's tests in the sandbox (`prove_variants_to` sums them)
PROVE_PARTS = ("generate", "prove")


class ProveVariants:
    """Actor: variants of each task in a batch, checked by this actor's sandbox."""

    def __init__(self, seed: int, timeout_s: float, threads: int, allow_weak_isolation: bool,
                 kinds: Sequence[str] | None = None):
        from leakray.sandbox import Sandbox, SandboxConfig

        self.seed, self.threads, self.kinds = seed, threads, kinds
        self.sandbox = Sandbox(SandboxConfig(timeout_s=timeout_s, allow_weak_isolation=allow_weak_isolation))

    def __call__(self, batch: pa.Table) -> pa.Table:
        return prove_batch(batch, self.sandbox, self.seed, self.threads, self.kinds)


def prove_batch(batch: pa.Table, sandbox, seed: int, threads: int = 2, kinds: Sequence[str] | None = None) -> pa.Table:
    """``kinds``: prove only these kinds' variants (None: all); another kind's slots are empty
    and absent from ``check`` (neither kept nor failed: not tried)."""
    from leakray.perturb.core import KINDS, SLOTS, slot_name, variants_of
    from leakray.perturb.keep import keep_variants

    tasks = batch.to_pylist()
    t0 = time.perf_counter()
    variants = [variants_of(t, seed, tuple(kinds) if kinds is not None else KINDS) for t in tasks]
    t1 = time.perf_counter()
    checks = keep_variants(tasks, variants, sandbox, workers=threads)
    per_row = [(t1 - t0) / max(1, len(tasks)), (time.perf_counter() - t1) / max(1, len(tasks))]
    prompts, slot_kinds, status = [], [], []
    for task, vs, cs in zip(tasks, variants, checks):
        by_slot = {c.slot: (v, c) for v, c in zip(vs, cs)}
        row_p, row_k = [task[T.PROMPT]], [BASE_SLOT]
        for kind, index in SLOTS:
            v, c = by_slot.get(slot_name(kind, index), (None, None))
            row_p.append(v.prompt if c is not None and c.kept else "")
            row_k.append(c.slot if c is not None and c.kept else "")
        prompts.append(row_p)
        slot_kinds.append(row_k)
        status.append([f"{c.language}|{c.kind}|{c.status}" for c in cs])
    return pa.table({C.TASK_ID: [t[T.TASK_ID] for t in tasks],
                     C.ADV_PROMPTS: pa.array(prompts, pa.list_(pa.string())),
                     C.ADV_KIND: pa.array(slot_kinds, pa.list_(pa.string())),
                     "check": pa.array(status, pa.list_(pa.string())),
                     C.PART_SECONDS: pa.array([per_row] * len(tasks), pa.list_(pa.float64()))})


def prove_parts(proven: pa.Table) -> tuple[pa.Table, dict]:
    """The proven rows without their times, and the stage's part seconds and throughput
    (variants written, then proven, per second of each part) from them."""
    if C.PART_SECONDS not in proven.column_names:
        return proven, {}
    rows = [r for r in proven.column(C.PART_SECONDS).to_pylist() if r]
    seconds = {part: sum(r[j] for r in rows) for j, part in enumerate(PROVE_PARTS)}
    tried = sum(len(c or ()) for c in proven.column("check").to_pylist())
    # the throughputs from the unrounded seconds: writing a few tasks' variants takes milliseconds
    return proven.drop_columns([C.PART_SECONDS]), {
        "part_seconds": {part: round(s, 2) for part, s in seconds.items()}, "throughput": {
            "variants_written_per_s": per_second(tried, seconds["generate"]),
            "variants_proven_per_s": per_second(tried, seconds["prove"])}}


def prove_steps(seed: int, timeout_s: float, threads: int, actors: int, allow_weak_isolation: bool,
                kinds: Sequence[str] | None = None) -> list[BatchStep]:
    # the sandbox's processes are outside Ray's accounting: its actors only wait on them
    return [BatchStep(ProveVariants, {"seed": seed, "timeout_s": timeout_s, "threads": threads,
                                      "allow_weak_isolation": allow_weak_isolation, "kinds": kinds},
                      StageResources(actors=actors, cpus=0.0))]


def task_table(tasks: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{k: t[k] for k in T.ALL} for t in tasks], schema=TASK_SCHEMA)


def one_row_per_task(result: pa.Table) -> pa.Table:
    """Actor tasks retry at least once: the first row of each task, sorted by task id."""
    ids = result.column(C.TASK_ID).to_pylist()
    first = sorted({t: i for i, t in reversed(list(enumerate(ids)))}.values())
    return result.take(first).sort_by(C.TASK_ID)


def kept_summary(result: pa.Table) -> dict:
    """Kept-variant rate per language and kind: kept / (kept + failed); not-applicable counted apart."""
    counts: dict[str, Counter] = {}
    for row in result.column("check").to_pylist():
        for item in row:
            language, kind, status = item.split("|")
            counts.setdefault(f"{language}/{kind}", Counter())[status] += 1
    out = {}
    for key, n in sorted(counts.items()):
        tried = n["kept"] + n["failed"]
        out[key] = {**dict(n), "rate": round(n["kept"] / tried, 4) if tried else None}
    return out


def attach_variants(table: pa.Table, variants_path: Path, kinds: Sequence[str] | None = None) -> pa.Table:
    """The collection's input table with each task's `adv_prompts` / `adv_kind` joined by task id.
    ``kinds``: the perturbation kinds to complete (None: all); another kind's slots are left
    empty, as an inapplicable variant's are, so nothing downstream decodes or embeds them."""
    from leakray.perturb.core import KINDS, SLOTS

    v = pq.read_table(variants_path)
    by_id = {t: i for i, t in enumerate(v.column(C.TASK_ID).to_pylist())}
    idx = [by_id[t] for t in table.column(C.TASK_ID).to_pylist()]
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown:
        raise BadInput(f"unknown AdvPrompt kinds {unknown} (known: {list(KINDS)})", field="columns.advprompt_kinds")
    # slot 0 is the task's own prompt, always kept; slots 1..11 follow SLOTS
    keep = [True] + [kinds is None or kind in kinds for kind, _ in SLOTS]
    for name in (C.ADV_PROMPTS, C.ADV_KIND):
        rows = v.column(name).take(idx).to_pylist()
        if not all(keep):
            rows = [None if r is None else [x if k else "" for x, k in zip(r, keep)] for r in rows]
        table = table.append_column(name, pa.array(rows, pa.list_(pa.string())))
    return table
