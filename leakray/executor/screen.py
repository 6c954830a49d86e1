"""The screen's corpus pass as a Ray Data actor pool (`leakray.screen.driver.local_batches` is
the same pass in-process).

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

from leakray.screen import corpus as C
from leakray.screen.driver import FILES_PER_BATCH, Batches
from leakray.screen.index import BenchmarkIndex
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


def ray_batches(index: BenchmarkIndex, plan: C.CorpusPlan, workers: int | None = None) -> Batches:
    """The corpus pass on the running Ray (`runtime.ensure_ray` first): one actor per CPU by default."""
    import ray

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
