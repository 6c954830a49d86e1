"""A screen's parts, engine-agnostic: plan the corpus and load the benchmarks (`prepare`), index
them and stream the corpus through batches run in-process here or on Ray by the executor
(`corpus_pass`), write the outputs (`write_outputs`), and say in one line what was read and what
was not. `leakray.protocols.screen` runs them as resumable stages."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class Prepared:
    """What a screen's stages share: the corpus plan, the run key (config + benchmark files +
    corpus fingerprint: other inputs, another run), the tasks and the texts to screen."""

    benchmarks: list[tuple[str, str]]
    corpus: str
    config: ScreenConfig
    plan: C.CorpusPlan
    key: str
    tasks: dict[str, list[dict]]
    entries: Entries

    @property
    def record(self) -> dict:
        return {**self.config.record(), "digest": self.config.digest()}


def prepare(benchmarks: list[tuple[str, str]], corpus: str, config: ScreenConfig | None = None) -> Prepared:
    """Plan the corpus (list and classify its files, nothing read yet) and load the benchmarks."""
    from leakray.data.registry import load_benchmark_file

    config = config or ScreenConfig()
    names = [n for n, _ in benchmarks]
    if len(set(names)) != len(names):
        raise BadInput(f"benchmark names must be distinct, got {names}")
    for name, path in benchmarks:  # before the run key, which digests each file
        if not Path(path).is_file():
            raise BadInput(f"benchmark {name!r}: no such file", path=path)
    plan = C.screenable_plan(corpus, config.max_file_bytes, config.max_parse_bytes)
    key = O.run_key(config.digest(), benchmarks, plan.fingerprint())
    tasks = {name: load_benchmark_file(name, path) for name, path in benchmarks}
    return Prepared(list(benchmarks), corpus, config, plan, key, tasks, Entries.from_tasks(tasks, config.parts))


def corpus_pass(prep: Prepared, batches: Callable[[BenchmarkIndex, C.CorpusPlan], Batches], engine: str,
                log=None) -> tuple[list[dict], dict, list[bool]]:
    """Index the benchmarks' texts, stream the corpus once through ``batches`` (in-process or on
    Ray; the same screener either way): (pairs as worker records, corpus stats, screenable per text)."""
    log = log or default_log
    plan = prep.plan
    index = BenchmarkIndex.for_entries(prep.config, prep.entries)
    log(f"indexed {len(prep.entries)} texts ({', '.join(prep.config.parts)}) of {len(prep.tasks)} benchmarks "
        f"({index.nbytes / max(1, len(prep.entries)):.0f} B/text); corpus: {plan.n_files} files, {len(plan.files)} "
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
    corpus_stats = corpus_summary(prep.corpus, stats, plan, pass_s, engine, index.nbytes)
    log(f"corpus pass done in {pass_s:.1f}s: {files_line(corpus_stats)}; {stats['pairs']} pairs")
    return pairs, corpus_stats, index.screenable.tolist()


def write_outputs(prep: Prepared, pairs: list[dict], corpus_stats: dict, screenable: list[bool], output: str,
                  seconds: float, log=None) -> dict:
    """pairs.parquet, labels.csv, the cleaned benchmarks and summary.json (with its run key)."""
    log = log or default_log
    summary = O.write_outputs(output, key=prep.key, entries=prep.entries, pairs=pairs, benchmarks=prep.benchmarks,
                              n_tasks={n: len(t) for n, t in prep.tasks.items()}, corpus_stats=corpus_stats,
                              config_record=prep.record, seconds=seconds, screenable=screenable)
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
    warned = "".join(f"; WARNING: {w}" for w in summary.get("warnings") or ())
    return f"leakray screen: {files_line(summary['corpus'])}; {leaks}{warned}; outputs in {where}"
