"""`leakray screen` wiring: index every benchmark once, stream the corpus once through Ray Data.

The index is built on the driver, ``ray.put`` once, and every actor of the map_batches pool maps
that one copy (numpy arrays pickle out-of-band, so workers on a node share the object-store
copy). Each corpus batch returns only its verified pairs and counters. ``engine="local"`` runs
the same stage code in-process without Ray (tests, small corpora). Corpus rows are file or shard
paths (``from_items``); each actor reads and streams its shards itself (JSONL line by line,
parquet batch by batch), so there are no read tasks competing with the actor pool for CPUs and a
corrupt shard is counted as unreadable instead of failing the dataset.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator

from leakray.screen import corpus as C
from leakray.screen import outputs as O
from leakray.screen.index import BenchmarkIndex, ScreenConfig
from leakray.screen.screener import BatchScreener, Stats

FILES_PER_BATCH = 256
PROGRESS_EVERY_S = 5.0


def _encode(pairs: list[dict], stats: Stats) -> dict:
    import numpy as np

    return {"pairs": np.array([json.dumps(pairs)], dtype=object),
            "stats": np.array([json.dumps({"counts": dict(stats), "examples": stats.examples})], dtype=object)}


class _RayScreener:
    """map_batches actor: fetches the shared index once, then screens batch after batch."""

    def __init__(self, index_box: list, kind: str):
        import ray

        self.screen = BatchScreener(ray.get(index_box[0]), kind)

    def __call__(self, batch: dict) -> dict:
        return _encode(*self.screen(batch))


def _ray_batches(index: BenchmarkIndex, plan: C.CorpusPlan, workers: int | None,
                 address: str | None, num_cpus: int | None) -> Iterator[tuple[list[dict], dict, dict]]:
    import ray

    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        if address:  # a submitted job, or a named cluster ("auto": the one `ray start` left here)
            ray.init(address=address)
        else:  # a fresh local Ray, never someone else's cluster by accident
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)
    index_ref = ray.put(index)
    nworkers = workers or max(1, int(ray.available_resources().get("CPU", 1)))
    datasets = []
    if plan.files:
        nblocks = max(1, min(len(plan.files) // FILES_PER_BATCH + 1, 4 * nworkers * 8))
        ds = ray.data.from_items([{"path": p} for p, _ in plan.files], override_num_blocks=nblocks)
        datasets.append(("files", ds, FILES_PER_BATCH))
    for kind, shards in (("jsonl", plan.jsonl), ("parquet", plan.parquet)):
        if shards:  # one shard per row: streamed inside the actor (line by line / record batch by batch)
            ds = ray.data.from_items([{"path": p} for p in shards], override_num_blocks=min(len(shards), 1000))
            datasets.append((kind, ds, 1))
    for kind, ds, batch_size in datasets:
        out = ds.map_batches(_RayScreener, fn_constructor_kwargs={"index_box": [index_ref], "kind": kind},
                             batch_size=batch_size, batch_format="numpy",
                             compute=ray.data.ActorPoolStrategy(size=min(nworkers, max(1, ds.num_blocks()))),
                             num_cpus=1)
        for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
            for pairs_json, stats_json in zip(batch["pairs"], batch["stats"]):
                st = json.loads(stats_json)
                yield json.loads(pairs_json), st["counts"], st["examples"]


def _local_batches(index: BenchmarkIndex, plan: C.CorpusPlan) -> Iterator[tuple[list[dict], dict, dict]]:
    files = BatchScreener(index, "files")
    for i in range(0, len(plan.files), FILES_PER_BATCH):
        pairs, st = files({"path": [p for p, _ in plan.files[i:i + FILES_PER_BATCH]]})
        yield pairs, dict(st), st.examples
    shards = BatchScreener(index, "jsonl")
    for path in plan.jsonl:
        pairs, st = shards({"path": [path]})
        yield pairs, dict(st), st.examples
    shards = BatchScreener(index, "parquet")
    for path in plan.parquet:
        pairs, st = shards({"path": [path]})
        yield pairs, dict(st), st.examples

def run_screen(benchmarks: list[tuple[str, str]], corpus: str, output: str, config: ScreenConfig | None = None,
               *, engine: str = "ray", workers: int | None = None, address: str | None = None,
               num_cpus: int | None = None, force: bool = False, log=None) -> dict:
    """Screen every benchmark against the corpus in one pass; returns summary.json's content."""
    from leakray.data.registry import load_benchmark_file
    from leakray.errors import BadInput

    from leakray.storage import RunStore, is_uri

    config = config or ScreenConfig()
    log = log or (lambda msg: print(f"[screen] {msg}", file=sys.stderr, flush=True))
    store = RunStore(output, "") if is_uri(output) else None  # a URI: staged here, mirrored there
    if store is not None:
        log(f"output {store.location} (staged in {store.local})")
        output = str(store.local)
    names = [n for n, _ in benchmarks]
    if len(set(names)) != len(names):
        raise BadInput(f"benchmark names must be distinct, got {names}")
    plan = C.plan_corpus(corpus, config.max_file_bytes)
    record = {**config.record(), "digest": config.digest()}
    key = O.run_key(config.digest(), benchmarks, plan.fingerprint())
    if not force and O.finished(output, key):
        log(f"{output} is complete for these inputs (run key {key}); nothing to do")
        with open(os.path.join(output, O.SUMMARY), encoding="utf-8") as fh:
            return json.load(fh)

    t0 = time.time()
    tasks = {name: load_benchmark_file(name, path) for name, path in benchmarks}
    entries = O.Entries.from_tasks(tasks, config.field)
    index = BenchmarkIndex(config, entries.text)
    bands, rows = config.lsh_params
    log(f"indexed {len(entries)} texts of {len(tasks)} benchmarks ({index.nbytes / max(1, len(entries)):.0f} "
        f"B/text, LSH {bands}x{rows}); corpus: {len(plan.files)} source files, {len(plan.jsonl)} JSONL and "
        f"{len(plan.parquet)} parquet shards")

    stats = Stats()
    pairs: list[dict] = []
    batches = _local_batches(index, plan) if engine == "local" else _ray_batches(index, plan, workers, address,
                                                                                    num_cpus)
    t_pass, last = time.time(), time.time()
    for got, counts, examples in batches:
        pairs.extend(got)
        stats.merge(counts, examples)
        if time.time() - last >= PROGRESS_EVERY_S:
            last = time.time()
            total = f"/{len(plan.files)}" if plan.files and not plan.jsonl and not plan.parquet else ""
            rate = stats["files_in"] / max(1e-9, last - t_pass)
            log(f"corpus {stats['files_in']}{total} files, {rate:.0f} files/s, {stats['pairs']} pairs")
    # files refused while planning (empty, huge) or unusable shards: counted on the driver
    stats.merge({"files_in": sum(plan.skipped.values()), **{"skipped:" + k: v for k, v in plan.skipped.items()}},
                plan.examples)
    pass_s = time.time() - t_pass
    skipped = {k.split(":", 1)[1]: v for k, v in stats.items() if k.startswith("skipped:") and v}
    corpus_stats = {
        "spec": corpus, "files_in": stats["files_in"], "screened": stats["screened"], "bytes": stats["bytes"],
        "skipped": skipped, "skipped_examples": {k: v for k, v in stats.examples.items() if k in skipped},
        "signed": stats["signed"], "candidates_jaccard": stats["candidates_jaccard"],
        "candidates_containment": stats["candidates_containment"], "pairs": stats["pairs"],
        "pass_seconds": round(pass_s, 3), "worker_seconds": round(stats["seconds"], 3),
        "engine": engine, "index_bytes": index.nbytes,
    }
    log(f"corpus pass done: {stats['files_in']} in, {stats['screened']} screened, skipped {skipped}, "
        f"{stats['pairs']} pairs in {pass_s:.1f}s")
    summary = O.write_outputs(output, key=key, entries=entries, pairs=pairs, benchmarks=benchmarks,
                              n_tasks={n: len(t) for n, t in tasks.items()}, corpus_stats=corpus_stats,
                              config_record=record, seconds=time.time() - t0,
                              screenable=index.screenable.tolist())
    for name, b in summary["benchmarks"].items():
        log(f"{name}: {b['n_leaked']}/{b['n_samples']} samples leaked ({b['ratio']:.1%}), {b['n_pairs']} pairs")
    if store is not None:
        store.close()
    return summary
