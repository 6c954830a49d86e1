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
from leakray.schema import C, X
from leakray.stages.collect import (CollectConfig, collect_steps, collection_stats, finalize, retryable_rows,
                                    write_collection)

LOG = logging.getLogger(__name__)


def collect(table: pa.Table, model_path: str, cfg: CollectConfig, *, engine: str = "ray",
            out_dir: Path | None = None, errors_path: Path | None = None, retried: dict | None = None,
            kept: Path | None = None) -> pa.Table:
    """The collection of ``table`` (``engine``: "ray" streams the steps as Ray Data operators and
    writes part files under ``out_dir``; "local" runs them in this process).

    A row that failed for a reason another attempt can cure (`row_retryable`: a rate limit or an
    outage that outlasted the endpoint sampler's own retries) is collected again after the whole
    table, up to ``sample.row_retries`` more passes, each after a pause of ``sample.row_retry_wait_s``;
    the attempt that went through is kept (`finalize`). Not when no row went through: that is a
    systemic fault (an endpoint that is down, a wrong URL), which `finalize` reports at once.
    ``kept``: a resumable stage's `runs.kept_dir`. The part files go there (each attempt its own
    directory), and the rows a killed attempt had finished there are read back and not collected
    again (`kept_rows`).
    ``retried``: filled with what the passes did (``rows``: rows collected again, ``recovered``:
    those that went through; ``resumed``: rows read back from a killed attempt; ``endpoint_usage``:
    what an endpoint was asked for, every attempt of the stage that kept its files included)."""
    usage_to = None
    if cfg.sample.backend == "openai" and (kept or out_dir) is not None:
        from leakray.storage import shared_dir

        usage_to = shared_dir(Path(kept or out_dir) / USAGE_DIR)
    steps = collect_steps(model_path, cfg, usage_to)
    earlier = kept_rows(kept) if kept is not None else None
    where = out_dir if kept is None else kept / f"attempt-{time.time_ns()}"
    parts, todo, done = [], table, pa.array([], pa.string())
    if earlier is not None:
        done = pa.array(sorted(set(earlier.column(C.TASK_ID).to_pylist())), pa.string())
        todo = table.filter(pc.invert(pc.is_in(table.column(C.TASK_ID), done)))
        parts.append(earlier)
        LOG.info("%d of %d rows read back from a killed attempt of this stage; collecting the other %d",
                 len(done), table.num_rows, todo.num_rows)
    if todo.num_rows or not parts:
        parts.append(run_steps(todo, steps, batch_size=cfg.batch_size, engine=engine, out_dir=where))
    raw = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
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
                         out_dir=None if where is None else where / f"retry-{attempt}")
        raw = pa.concat_tables([raw, more], promote_options="default")
        tried |= set(again)
        again = retryable_rows(raw)
    out = finalize(raw, errors_path)
    if retried is not None:
        retried.update(rows=len(tried), recovered=len(tried & set(out.column(C.TASK_ID).to_pylist())))
        if earlier is not None:
            retried["resumed"] = len(done)
        usage = endpoint_usage(*usage_to) if usage_to is not None else None
        if usage:
            usage["planned"] = planned_requests(table, cfg)
            retried["endpoint_usage"] = usage
    return out


def planned_requests(table: pa.Table, cfg: CollectConfig) -> int:
    """The requests `leakray audit --plan` counts for collecting ``table`` once, every request
    answered the first time (`stages.request_plan`): beside what was sent, it tells retries and
    refusals from what the settings ask."""
    from leakray.stages.request_plan import collection_requests

    tasks = table.select([C.PROMPT, C.REFERENCE, C.LANGUAGE]).to_pylist()
    adv = table.column(C.ADV_PROMPTS).to_pylist() if C.ADV_PROMPTS in table.column_names else None
    return collection_requests(tasks, cfg.sample, cfg.extra, adv if cfg.extra.advprompt else None).total.requests


# where each sampler worker keeps what it asked an endpoint for (`stages.sample.write_usage`)
USAGE_DIR = "endpoint_usage"


def endpoint_usage(directory: str, filesystem) -> dict | None:
    """What the stage's sampler workers asked an endpoint for, added up over their files: requests
    sent (retries and refusals too), retries among them, and the prompt and generated tokens the
    endpoint's answers reported. Each worker's file holds its totals after its last finished batch,
    so a worker killed mid-batch leaves that batch's requests out."""
    import json

    from pyarrow import fs as pafs

    filesystem = filesystem or pafs.LocalFileSystem()
    totals, workers = Counter(), 0
    for info in filesystem.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
        name = info.path.rsplit("/", 1)[-1]
        if info.type != pafs.FileType.File or not name.endswith(".json"):  # not a write in progress
            continue
        with filesystem.open_input_stream(info.path) as fh:
            totals.update(json.loads(fh.read()))
        workers += 1
    return {**totals, "workers": workers} if workers else None


def kept_rows(kept: Path) -> pa.Table | None:
    """The rows that went through in the part files under ``kept`` (every pass of every earlier
    attempt of this stage, written as each batch finished), or None. A part file that a kill
    cut short does not parse and is skipped: its rows are collected again. Read where the workers
    wrote them (the run's URI when it is mirrored: `storage.shared_dir`)."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    from leakray.stages.rows import row_failed
    from leakray.storage import shared_dir

    root, filesystem = shared_dir(kept)
    filesystem = filesystem or pafs.LocalFileSystem()
    found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    tables = []
    for info in sorted(found, key=lambda i: i.path):
        if info.type != pafs.FileType.File or not info.path.endswith(".parquet"):
            continue
        try:
            tables.append(pq.read_table(info.path, filesystem=filesystem))
        except (pa.ArrowInvalid, OSError) as exc:
            LOG.info("skipped a part file a killed attempt did not finish (%s): %s", info.path, exc)
    if not tables:
        return None
    rows = pa.concat_tables(tables, promote_options="default")
    notes = rows.column(C.NOTES).to_pylist() if C.NOTES in rows.column_names else [[]] * rows.num_rows
    keep = [i for i, n in enumerate(notes) if not row_failed(n)]  # a failed row is collected again
    return rows.take(keep) if keep else None


def collect_to(table: pa.Table, model_path: str, cfg: CollectConfig, out_dir: Path, engine: str = "ray") -> dict:
    """Collect ``table`` into ``out_dir/collection.parquet`` (failed rows to ``errors.parquet``);
    returns the stage's stats (``row_retries``: what the passes over failed rows did;
    ``resumed_rows``: rows a killed attempt had finished, read back, in a resumable stage;
    ``endpoint_usage``: what an endpoint was asked for)."""
    from leakray.progress import PROGRESS_FILE, expect_rows
    from leakray.runs import kept_dir
    from leakray.storage import clear_dir, shared_dir

    t0 = time.perf_counter()
    expect_rows(out_dir, table.num_rows, C.TASK_ID)  # the console's progress lines while rows come in
    errors, retried, kept = out_dir / "errors.parquet", {}, kept_dir(out_dir)
    coll = collect(table, model_path, cfg, engine=engine, out_dir=out_dir, errors_path=errors, retried=retried,
                   kept=kept)
    stats = collection_stats(coll, time.perf_counter() - t0, errors)
    if retried.get("rows"):
        stats["row_retries"] = {k: retried[k] for k in ("rows", "recovered")}
    if retried.get("resumed"):
        stats["resumed_rows"] = retried["resumed"]
    if retried.get("endpoint_usage"):
        stats["endpoint_usage"] = retried["endpoint_usage"]
    write_collection(coll, out_dir / "collection.parquet", stats)
    if kept is not None:  # the rows are in the collection now (where the workers wrote them, too)
        clear_dir(*shared_dir(kept.parent))
    (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return {"rows_in": table.num_rows, **stats}


# how the console names each sandbox status of a program (`schema.X.STATUSES`)
STATUS_WORDS = {"passed": "passed", "failed": "failed their tests", "timeout": "timed out",
                "memory": "ran out of memory", "error": "raised or did not compile"}


def summary_line(info: dict, parse_failures: bool = False) -> str:
    """A collection stage's console line: its tasks (and how many were read back after a kill),
    what their programs did in the sandbox (in the schema's order of statuses), and CodeBLEU's
    parse failures when asked. Before, the statuses were a printed dict: {'error': 385, ...}."""
    statuses = info.get("exec_status") or {}
    order = [s for s in X.STATUSES if statuses.get(s)] + sorted(s for s in statuses if s not in X.STATUSES)
    line = f"{info.get('rows_out', info.get('rows'))} tasks" + resumed_note(info)
    if order:
        line += (f", {sum(statuses.values())} programs: "
                 + ", ".join(f"{statuses[s]} {STATUS_WORDS.get(s, s)}" for s in order))
    failures = info.get("parse_failures") or {}
    if parse_failures and failures:
        line += "; CodeBLEU could not parse " + ", ".join(f"{n} ({why})" for why, n in sorted(failures.items()))
    return line


def resumed_note(info: dict) -> str:
    """A collection stage's console line, continued: the rows it read back from a killed attempt."""
    n = info.get("resumed_rows")
    return f" ({n} of them read back from a killed attempt)" if n else ""


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
    from leakray.perturb.keep import BASELINE_FAILED
    from leakray.progress import PROGRESS_FILE, expect_rows
    from leakray.protocols import proof_cache
    from leakray.stages.prove import kept_summary, one_row_per_task, prove_parts, prove_steps, task_table

    settings = {"seed": seed, "timeout_s": timeout_s, "allow_weak_isolation": allow_weak_isolation}
    every = kinds is None or set(kinds) >= set(KINDS)
    cached, todo = proof_cache.split_cached(tasks, settings)
    if not every:  # a row of these kinds only is never read as a whole row
        settings = {**settings, "kinds": [k for k in KINDS if k in kinds]}
        more, todo = proof_cache.split_cached(todo, settings)
        cached += more
    parts, timed = [], {}
    if todo or not cached:
        expect_rows(out_dir, len(todo), C.TASK_ID)  # the console's progress lines while proofs come in
        steps = prove_steps(seed, timeout_s, threads, actors, allow_weak_isolation, None if every else list(kinds))
        proven, timed = prove_parts(one_row_per_task(run_steps(task_table(todo), steps, batch_size=batch_size,
                                                               engine=engine, out_dir=out_dir)))
        proof_cache.store(todo, proven, settings)
        parts.append(proven)
    if cached:
        schema = parts[0].schema if parts else None
        parts.append(pa.Table.from_pylist(cached, schema=schema))
    result = pa.concat_tables(parts).sort_by(C.TASK_ID) if len(parts) > 1 else parts[0]
    pq.write_table(result, out_dir / "variants.parquet")
    (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    # a task whose reference fails its own tests gets no variant (every check says so): counted,
    # since many of them mean a wrong file (a prompt that is not the program's beginning, a runner)
    failed = sum(any(c.endswith(f"|{BASELINE_FAILED}") for c in row or ())
                 for row in result.column("check").to_pylist())
    return {"kept": kept_summary(result), "from_cache": len(cached), "references_failed": failed, **timed}


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

    return StageSpec("perturb", run, perturb_line)


def perturb_line(i: dict) -> str:
    """The perturb stage's console line: the kept rate per language and kind, or, where no variant
    could be tried (a benchmark without tests has nothing to prove them against), why none was."""
    rates = ", ".join(f"{k} {v['rate']:.0%}" for k, v in i["kept"].items() if v.get("rate") is not None)
    if not rates:
        from collections import Counter

        from leakray.perturb.keep import NO_TESTS

        statuses = Counter()
        for v in i["kept"].values():
            statuses.update({s: n for s, n in v.items() if s != "rate"})
        why = ("no task has tests to prove them against" if set(statuses) == {NO_TESTS}
               else ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "no variant")
        rates = f"none could be proven ({why}); AdvPrompt-MIA has nothing to read"
    return (f"AdvPrompt variants kept: {rates}"
            + (f" ({i['from_cache']} of {i['rows_in']} tasks proven by an earlier run)" if i.get("from_cache") else "")
            + (f"; {i['references_failed']} of {i['rows_in']} tasks' references fail their own tests and get no "
               "variant (`leakray benchmarks validate NAME=PATH` shows why; a prompt must be the program's "
               "beginning)" if i.get("references_failed") else ""))


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


def wants_second_reference(cfg) -> bool:
    """Whether a requested detector reads the non-oracle reference model: its token log-probabilities
    (`ref_calibrated_nonoracle`) or its draws at the probes' cuts (the probes' `_nonoracle` variants)."""
    from leakray.stages.sample import ALT_REFERENCE_COLUMNS

    return reads_any(cfg, set(ALT_REFERENCE_COLUMNS))


def wanted_probes(cfg) -> tuple[str, ...]:
    """The memory probes switched on that a requested detector reads."""
    from leakray.stages.sample import PROBE_COLUMNS

    return tuple(p for p in cfg.columns.probes if reads_any(cfg, set(PROBE_COLUMNS[p])))


def with_variants(table: pa.Table, cfg, stage_dir: Path) -> pa.Table:
    """The collection's input with each task's proven AdvPrompt variants, when the run makes them."""
    if not wants_advprompt(cfg):
        return table
    from leakray.stages.prove import attach_variants

    return attach_variants(table, Path(stage_dir) / "variants.parquet", kinds=cfg.columns.advprompt_kinds)
