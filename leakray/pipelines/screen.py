"""`leakray screen` on Ray: the driver of `leakray.screen.driver`, with the corpus batches run by
a Ray Data actor pool instead of in-process.

The index is built on the driver, ``ray.put`` once, and every actor of the map_batches pool maps
that one copy (numpy arrays pickle out-of-band, so workers on a node share the object-store
copy). Each corpus batch returns only its verified pairs and counters. Corpus rows are paths
(``from_items``): small files in batches, shards (JSONL, parquet, Arrow, compressed or big
files) one per row; each actor reads and streams them itself, so there are no read tasks
competing with the actor pool for CPUs and a corrupt shard is counted as unreadable instead of
failing the dataset.
"""

from __future__ import annotations

import json
import os

from leakray.screen import corpus as C
from leakray.screen.driver import FILES_PER_BATCH, Batches, default_log, local_batches
from leakray.screen.driver import screen as screen_driver
from leakray.screen.index import BenchmarkIndex, ScreenConfig
from leakray.screen.screener import BatchScreener, Stats


def _encode(pairs: list[dict], stats: Stats) -> dict:
    import numpy as np

    return {"pairs": np.array([json.dumps(pairs)], dtype=object),
            "stats": np.array([json.dumps({"counts": dict(stats), "examples": stats.examples})], dtype=object)}


class _RayScreener:
    """map_batches actor: fetches the shared index once, then screens batch after batch."""

    def __init__(self, index_box: list):
        import ray

        self.screen = BatchScreener(ray.get(index_box[0]), "files")

    def __call__(self, batch: dict) -> dict:
        return _encode(*self.screen(batch))


def _ray_batches(index: BenchmarkIndex, plan: C.CorpusPlan, workers: int | None,
                 address: str | None, num_cpus: int | None) -> Batches:
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
        datasets.append((ray.data.from_items([{"path": p} for p, _ in plan.files], override_num_blocks=nblocks),
                         FILES_PER_BATCH))
    if plan.shards:  # one shard per row: streamed inside the actor (line by line / record batch by batch)
        datasets.append((ray.data.from_items([{"path": p} for p, _ in plan.shards],
                                             override_num_blocks=min(len(plan.shards), 1000)), 1))
    for ds, batch_size in datasets:
        out = ds.map_batches(_RayScreener, fn_constructor_kwargs={"index_box": [index_ref]},
                             batch_size=batch_size, batch_format="numpy",
                             compute=ray.data.ActorPoolStrategy(size=min(nworkers, max(1, ds.num_blocks()))),
                             num_cpus=1)
        for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
            for pairs_json, stats_json in zip(batch["pairs"], batch["stats"]):
                st = json.loads(stats_json)
                yield json.loads(pairs_json), st["counts"], st["examples"]


def run_screen(benchmarks: list[tuple[str, str]], corpus: str, output: str, config: ScreenConfig | None = None,
               *, engine: str = "ray", workers: int | None = None, address: str | None = None,
               num_cpus: int | None = None, force: bool = False, log=None) -> dict:
    """Screen every benchmark against the corpus in one pass; returns summary.json's content."""
    from leakray.storage import RunStore, is_uri

    log = log or default_log
    store = RunStore(output, "") if is_uri(output) else None  # a URI: staged here, mirrored there
    if store is not None:
        log(f"output {store.location} (staged in {store.local})")
        output = str(store.local)
    if engine == "local":
        batches = local_batches
    else:
        def batches(index, plan):
            return _ray_batches(index, plan, workers, address, num_cpus)
    summary = screen_driver(benchmarks, corpus, output, config, batches=batches, engine=engine, force=force, log=log)
    if store is not None:
        store.close()
    return summary
