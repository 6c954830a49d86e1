"""What a Ray Train run costs beside the work it runs, side by side in one process and one Ray.

    python benchmarks/bench_ray_train.py RUN_DIR [--seeds 2] [--repeats 2]

RUN_DIR is a simulate run (``runs/humaneval-<hash>``: its collect_shadow and collect_target
collections). Printed, each timed ``--repeats`` times on the same local Ray:

- an empty training loop on a TorchTrainer worker group: Ray Train's start-up alone;
- a small fine-tune (the prebuilt base, 6 HumanEval solutions, 2 epochs) on Ray Train and as one
  Ray task (``ray.use_ray_train: auto`` on CPUs), and the ratio; the saved weights must be equal;
- CGMIA's seeds (the demo's detect settings) on one Ray Train run, against the same seeds as
  Ray tasks side by side (``detect.parallel``, what ``use_ray_train: auto`` does on CPUs), and
  the ratio; the scores must agree (each seed seeds itself).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _empty(config: dict) -> dict:
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import hashlib

    import numpy as np
    import pyarrow.parquet as pq

    from leakray.config import DEFAULT, load_config
    from leakray.data.humaneval import read_humaneval
    from leakray.executor.runtime import ensure_ray
    from leakray.executor.train import finetune_on_ray, fit_on_ray
    from leakray.models.finetune import FinetuneConfig
    from leakray.protocols.detectors import evaluate_detectors
    from leakray.schema import T

    ensure_ray(None, verbose=False)
    shadow = pq.read_table(args.run_dir / "collect_shadow" / "collection.parquet")
    target = pq.read_table(args.run_dir / "collect_target" / "collection.parquet")
    cgmia = load_config([DEFAULT], []).detect.cgmia_config()
    seeds = list(range(args.seeds))
    storage = Path(tempfile.mkdtemp(prefix="bench-ray-train-"))
    print(f"{shadow.num_rows} shadow + {target.num_rows} target tasks, {len(seeds)} CGMIA seeds, "
          f"{cgmia.epochs} epochs")

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    def cgmia_scores(on_train: bool):
        res = evaluate_detectors(shadow, target, cgmia, seeds, detectors=["cgmia"], use_ray_train=on_train,
                                 storage_path=storage, bootstrap=0, trace_memory=False, parallel=True)
        return res["scores"].sort_by([("seed", "ascending"), ("task_id", "ascending")]).column("score").to_numpy()

    base = Path(__file__).resolve().parent.parent / "leakray" / "prebuilt" / "base"
    texts = [t[T.PROMPT] + t[T.REFERENCE] for t in read_humaneval()[:6]]
    ft = FinetuneConfig(epochs=2, seed=1)

    def finetune(on_train: bool, r: int) -> str:
        out = storage / f"ft-{on_train}-{r}"
        finetune_on_ray(base, texts, ft, out, name=f"ft{r}", storage=storage, ray_train=on_train)
        return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()

    rows = []
    for r in range(args.repeats):
        a, on_train = timed(lambda: finetune(True, r))
        b, as_task = timed(lambda: finetune(False, r))
        assert a == b, "the two executors saved other weights"
        print(f"repeat {r}: fine-tune on Ray Train {on_train:.1f} s, as a Ray task {as_task:.1f} s, "
              f"ratio {on_train / as_task:.2f}x, the same weights", flush=True)
    for r in range(args.repeats):
        _, empty = timed(lambda: fit_on_ray(_empty, {}, name=f"empty{r}", storage=storage, num_workers=1,
                                            use_gpu=False, cpus=1))
        a, on_train = timed(lambda: cgmia_scores(True))
        b, as_tasks = timed(lambda: cgmia_scores(False))
        assert np.allclose(a, b, atol=1e-5), "the two executors gave other scores"
        rows.append((empty, on_train, as_tasks))
        print(f"repeat {r}: empty Train run {empty:.1f} s | CGMIA on Ray Train {on_train:.1f} s, "
              f"as Ray tasks {as_tasks:.1f} s, ratio {on_train / as_tasks:.2f}x", flush=True)
    med = np.median(np.array(rows), axis=0)
    print(f"median: empty Train run {med[0]:.1f} s; CGMIA on Ray Train {med[1]:.1f} s vs Ray tasks "
          f"{med[2]:.1f} s ({med[1] / med[2]:.2f}x); the same scores")


if __name__ == "__main__":
    main()
