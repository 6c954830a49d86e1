"""One screen, engine-agnostic: plan the corpus, index the benchmarks, run the corpus batches
(in-process here, or through Ray in `leakray.pipelines.screen`), write the outputs, and say
in one line what was read and what was not."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator

from leakray.errors import BadInput
from leakray.screen import corpus as C
from leakray.screen import outputs as O
from leakray.screen.index import BenchmarkIndex, ScreenConfig
from leakray.screen.parts import Entries
from leakray.screen.screener import BatchScreener, Stats

FILES_PER_BATCH = 256
PROGRESS_EVERY_S = 5.0

def default_log(msg: str) -> None:
    print(f"[screen] {msg}", file=sys.stderr, flush=True)


Batches = Iterator[tuple[list[dict], dict, dict]]  # (pairs, counts, examples) per batch


def local_batches(index: BenchmarkIndex, plan: C.CorpusPlan) -> Batches:
    screen = BatchScreener(index, "files")
    for i in range(0, len(plan.files), FILES_PER_BATCH):
        pairs, st = screen({"path": [p for p, _ in plan.files[i:i + FILES_PER_BATCH]]})
        yield pairs, dict(st), st.examples
    for path, _ in plan.shards:
        pairs, st = screen({"path": [path]})
        yield pairs, dict(st), st.examples


def screen(benchmarks: list[tuple[str, str]], corpus: str, output: str, config: ScreenConfig | None = None, *,
           batches: Callable[[BenchmarkIndex, C.CorpusPlan], Batches] = local_batches, engine: str = "local",
           force: bool = False, log=None) -> dict:
    """Screen every benchmark against the corpus in one pass; returns summary.json's content."""
    from leakray.data.registry import load_benchmark_file

    config = config or ScreenConfig()
    log = log or default_log
    names = [n for n, _ in benchmarks]
    if len(set(names)) != len(names):
        raise BadInput(f"benchmark names must be distinct, got {names}")
    plan = C.plan_corpus(corpus, config.max_file_bytes, config.max_parse_bytes)
    record = {**config.record(), "digest": config.digest()}
    key = O.run_key(config.digest(), benchmarks, plan.fingerprint())
    if not force and O.finished(output, key):
        log(f"{output} is complete for these inputs (run key {key}); nothing to do")
        with open(os.path.join(output, O.SUMMARY), encoding="utf-8") as fh:
            return json.load(fh)

    t0 = time.time()
    tasks = {name: load_benchmark_file(name, path) for name, path in benchmarks}
    entries = Entries.from_tasks(tasks, config.parts)
    index = BenchmarkIndex(config, entries.text, groups=entries.group_ids())
    log(f"indexed {len(entries)} texts ({', '.join(config.parts)}) of {len(tasks)} benchmarks "
        f"({index.nbytes / max(1, len(entries)):.0f} B/text); corpus: {plan.n_files} files, {len(plan.files)} "
        f"read in batches, {len(plan.shards)} alone (shards, compressed or big)")

    stats = Stats()
    pairs: list[dict] = []
    t_pass = last = time.time()
    for got, counts, examples in batches(index, plan):
        pairs.extend(got)
        stats.merge(counts, examples)
        if time.time() - last >= PROGRESS_EVERY_S:
            last = time.time()
            rate = stats["files_in"] / max(1e-9, last - t_pass)
            log(f"corpus {stats['files_in']}/{plan.n_files} files, {rate:.0f} files/s, {stats['pairs']} pairs")
    # files refused while planning (empty, binary, huge) are counted on the driver
    stats.merge({"files_in": sum(plan.skipped.values()),
                 **{f"files_skipped:{k}": v for k, v in plan.skipped.items()}},
                {f"files:{k}": v for k, v in plan.examples.items()})
    pass_s = time.time() - t_pass
    corpus_stats = corpus_summary(corpus, stats, plan, pass_s, engine, index.nbytes)
    log(f"corpus pass done in {pass_s:.1f}s: {files_line(corpus_stats)}; {stats['pairs']} pairs")
    summary = O.write_outputs(output, key=key, entries=entries, pairs=pairs, benchmarks=benchmarks,
                              n_tasks={n: len(t) for n, t in tasks.items()}, corpus_stats=corpus_stats,
                              config_record=record, seconds=time.time() - t0,
                              screenable=index.screenable.tolist())
    for name, b in summary["benchmarks"].items():
        per_part = ", ".join(f"{p} {v['n_leaked']}" for p, v in b["parts"].items())
        log(f"{name}: {b['n_leaked']}/{b['n_samples']} samples leaked ({b['ratio']:.1%}; by part: {per_part}), "
            f"{b['n_pairs']} pairs")
    return summary


def corpus_summary(spec: str, stats: Stats, plan: C.CorpusPlan, pass_s: float, engine: str, index_bytes: int) -> dict:
    files_skipped = stats.skipped("files")
    out = {
        "spec": spec,
        "files": {"in": stats["files_in"], "screened": stats["files_screened"], "skipped": files_skipped,
                  "truncated": stats["files_truncated"], "formats": dict(sorted(plan.formats.items()))},
        "documents": stats["documents"],
        "texts": {"screened": stats["texts_screened"], "skipped": stats.skipped("texts")},
        "skipped_examples": {k: v for k, v in sorted(stats.examples.items())},
        "bytes": stats["bytes"], "candidates": stats["candidates"], "rejected_by_span": stats["rejected_by_span"],
        "pairs": stats["pairs"], "pass_seconds": round(pass_s, 3), "worker_seconds": round(stats["seconds"], 3),
        "engine": engine, "index_bytes": index_bytes,
    }
    out["files"]["accounted"] = out["files"]["screened"] + sum(files_skipped.values()) == out["files"]["in"]
    return out


def files_line(corpus: dict) -> str:
    f = corpus["files"]
    skipped = sum(f["skipped"].values())
    why = ", ".join(f"{k} {v}" for k, v in sorted(f["skipped"].items(), key=lambda kv: -kv[1]))
    return (f"{f['in']} files: {f['screened']} screened, {skipped} skipped" + (f" ({why})" if why else "")
            + f"; {corpus['documents']} documents, {corpus['texts']['screened']} texts screened")


def closing_line(summary: dict, where: str) -> str:
    """The console's last line: what was read, what was not, what leaked, where the outputs are."""
    leaks = "; ".join(f"{n} {b['n_leaked']}/{b['n_samples']} leaked ({b['ratio']:.1%})"
                      for n, b in summary["benchmarks"].items())
    return f"leakray screen: {files_line(summary['corpus'])}; {leaks}; outputs in {where}"
