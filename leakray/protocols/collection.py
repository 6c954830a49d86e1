"""One collection, wherever it runs: the collection's steps through an executor, then one row
per task (retries deduplicated, failed rows to ``errors.parquet``) and the stage's stats."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from leakray.executor.batches import run_steps
from leakray.schema import C
from leakray.stages.collect import (CollectConfig, collect_steps, collection_stats, finalize, retryable_rows,
                                    write_collection)

LOG = logging.getLogger(__name__)


def collect(table: pa.Table, model_path: str, cfg: CollectConfig, *, engine: str = "ray",
            out_dir: Path | None = None, errors_path: Path | None = None, retried: dict | None = None) -> pa.Table:
    """The collection of ``table`` (``engine``: "ray" streams the steps as Ray Data operators and
    writes part files under ``out_dir``; "local" runs them in this process).

    A row that failed for a reason another attempt can cure (`row_retryable`: a rate limit or an
    outage that outlasted the endpoint sampler's own retries) is collected again after the whole
    table, up to ``sample.row_retries`` more passes, each after a pause of ``sample.row_retry_wait_s``;
    the attempt that went through is kept (`finalize`). Not when no row went through: that is a
    systemic fault (an endpoint that is down, a wrong URL), which `finalize` reports at once.
    ``retried``: filled with what the passes did (``rows``: rows collected again, ``recovered``:
    those that went through)."""
    steps = collect_steps(model_path, cfg)
    raw = run_steps(table, steps, batch_size=cfg.batch_size, engine=engine, out_dir=out_dir)
    again, tried = retryable_rows(raw), set()
    for attempt in range(1, cfg.sample.row_retries + 1):
        if not again or len(again) == len(set(table.column(C.TASK_ID).to_pylist())):
            break
        reasons = Counter(n for notes in again.values() for n in notes if "failed:" in n)
        LOG.warning("%d rows failed for a reason another attempt can cure (%s); collecting them again in %.0f s "
                    "(pass %d of at most %d)", len(again), ", ".join(f"{r} x{c}" for r, c in reasons.most_common(3)),
                    cfg.sample.row_retry_wait_s, attempt, cfg.sample.row_retries)
        time.sleep(cfg.sample.row_retry_wait_s)
        todo = table.filter(pc.is_in(table.column(C.TASK_ID), pa.array(sorted(again), pa.string())))
        more = run_steps(todo, steps, batch_size=cfg.batch_size, engine=engine,
                         out_dir=None if out_dir is None else out_dir / f"retry-{attempt}")
        raw = pa.concat_tables([raw, more], promote_options="default")
        tried |= set(again)
        again = retryable_rows(raw)
    out = finalize(raw, errors_path)
    if retried is not None:
        retried.update(rows=len(tried), recovered=len(tried & set(out.column(C.TASK_ID).to_pylist())))
    return out


def collect_to(table: pa.Table, model_path: str, cfg: CollectConfig, out_dir: Path, engine: str = "ray") -> dict:
    """Collect ``table`` into ``out_dir/collection.parquet`` (failed rows to ``errors.parquet``);
    returns the stage's stats (``row_retries``: what the passes over failed rows did)."""
    t0 = time.perf_counter()
    errors, retried = out_dir / "errors.parquet", {}
    coll = collect(table, model_path, cfg, engine=engine, out_dir=out_dir, errors_path=errors, retried=retried)
    stats = collection_stats(coll, time.perf_counter() - t0, errors)
    if retried.get("rows"):
        stats["row_retries"] = retried
    write_collection(coll, out_dir / "collection.parquet", stats)
    return {"rows_in": table.num_rows, **stats}


def prove_variants_to(tasks: list[dict], out_dir: Path, *, seed: int, timeout_s: float, threads: int, actors: int,
                      allow_weak_isolation: bool, batch_size: int = 8, engine: str = "ray",
                      kinds: list[str] | None = None) -> dict:
    """The AdvPrompt variants of every task, proven in the sandbox, into ``out_dir/variants.parquet``
    (one row per task); returns the kept-variant rates and how many tasks came from the proof
    cache (``protocols.proof_cache``: a task proven by an earlier run under the same settings).
    ``kinds``: prove only these kinds' variants (None or all five: every variant). A run of fewer
    kinds reads the whole rows an earlier run of all five proved (the collection leaves the other
    kinds' slots empty) and keeps the rows it proves under a key of its own kinds."""
    import pyarrow.parquet as pq

    from leakray.perturb.core import KINDS
    from leakray.protocols import proof_cache
    from leakray.stages.prove import kept_summary, one_row_per_task, prove_steps, task_table

    settings = {"seed": seed, "timeout_s": timeout_s, "allow_weak_isolation": allow_weak_isolation}
    every = kinds is None or set(kinds) >= set(KINDS)
    cached, todo = proof_cache.split_cached(tasks, settings)
    if not every:  # a row of these kinds only is never read as a whole row
        settings = {**settings, "kinds": [k for k in KINDS if k in kinds]}
        more, todo = proof_cache.split_cached(todo, settings)
        cached += more
    parts = []
    if todo or not cached:
        steps = prove_steps(seed, timeout_s, threads, actors, allow_weak_isolation, None if every else list(kinds))
        proven = one_row_per_task(run_steps(task_table(todo), steps, batch_size=batch_size, engine=engine,
                                            out_dir=out_dir))
        proof_cache.store(todo, proven, settings)
        parts.append(proven)
    if cached:
        schema = parts[0].schema if parts else None
        parts.append(pa.Table.from_pylist(cached, schema=schema))
    result = pa.concat_tables(parts).sort_by(C.TASK_ID) if len(parts) > 1 else parts[0]
    pq.write_table(result, out_dir / "variants.parquet")
    return {"kept": kept_summary(result), "from_cache": len(cached)}


def perturb_spec(cfg, tasks: list[dict]):
    """The AdvPrompt variants as a protocol stage (simulate and audit alike): model-independent,
    so both collections of a run read the one ``perturb/variants.parquet``."""
    from leakray.runs import StageSpec

    def run(out: Path) -> dict:
        got = prove_variants_to(tasks, out, seed=cfg.columns.advprompt_seed, timeout_s=cfg.execute.timeout_s,
                                threads=cfg.execute.threads, actors=cfg.ray.execute_actors,
                                allow_weak_isolation=cfg.execute.allow_weak_isolation,
                                kinds=cfg.columns.advprompt_kinds)
        return {"rows_in": len(tasks), "rows_out": len(tasks), **got}

    return StageSpec("perturb", run, lambda i: "AdvPrompt variants kept: " + ", ".join(
        f"{k} {v['rate']:.0%}" for k, v in i["kept"].items() if v.get("rate") is not None)
        + (f" ({i['from_cache']} of {i['rows_in']} tasks proven by an earlier run)" if i.get("from_cache") else ""))


def reads_any(cfg, columns: set[str]) -> bool:
    """Whether a requested detector reads any of ``columns``: an extra pass of the model that no
    requested detector reads is skipped (``detect.detectors: all`` keeps every switched-on pass)."""
    from leakray.detect import registry

    chosen = cfg.detect.detectors
    return chosen == "all" or any(set(registry.spec(n).columns) & columns for n in chosen)


def wants_advprompt(cfg) -> bool:
    from leakray.schema import C

    return bool(cfg.columns.advprompt) and reads_any(cfg, {C.ADV_EMBEDDING, C.ADV_PERPLEXITY, C.ADV_COMPLETIONS})


def wants_upper_case(cfg) -> bool:
    from leakray.schema import C

    return bool(cfg.columns.upper_case) and reads_any(cfg, {C.UPPER_COMPLETIONS, C.UPPER_PERPLEXITY})


def wanted_probes(cfg) -> tuple[str, ...]:
    """The memory probes switched on that a requested detector reads."""
    from leakray.stages.collect import PROBE_COLUMNS

    return tuple(p for p in cfg.columns.probes if reads_any(cfg, set(PROBE_COLUMNS[p])))


def with_variants(table: pa.Table, cfg, stage_dir: Path) -> pa.Table:
    """The collection's input with each task's proven AdvPrompt variants, when the run makes them."""
    if not wants_advprompt(cfg):
        return table
    from leakray.stages.prove import attach_variants

    return attach_variants(table, Path(stage_dir) / "variants.parquet", kinds=cfg.columns.advprompt_kinds)
