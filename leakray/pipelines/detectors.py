"""Detectors on Ray: CGMIA training as a Ray Train run, and the shadow -> target evaluation.

Ray Train V2 (default in Ray 2.60) keeps reported metrics only together with a
checkpoint, so the trained detector comes back as rank 0's return value
(``Result.return_value``): a plain state dict, a few MB for d=768.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import ray

from leakray.detect.arrays import scalar_column
from leakray.detect.baselines import BASELINES
from leakray.detect.cgmia import CGMIAConfig, CGMIADetector, arrays_from_table, fit
from leakray.errors import BadInput
from leakray.evaluate.metrics import binary_metrics, median_over_repeats
from leakray.schema import C, S

CGMIA = "cgmia"
BASELINE_SEED = -1  # S.SEED of seed-free detectors

SCORES_SCHEMA = pa.schema([
    (S.TASK_ID, pa.string()),
    (S.DETECTOR, pa.string()),
    (S.SEED, pa.int64()),
    (S.SCORE, pa.float64()),
    (S.PREDICTION, pa.int8()),
    (S.MEMBER, pa.int8()),
])


def _train_loop(loop_config: dict) -> list[dict]:
    # Runs on the Ray Train worker. The arrays arrive as an object ref, not pickled
    # into the config, so the driver's copy is shared through the object store.
    import ray.train

    arrays = ray.get(loop_config["arrays"])
    config = CGMIAConfig.from_dict(loop_config["config"])

    def report(epoch: int, metrics: dict, seed: int) -> None:
        # Each report is a round trip to the controller (~2 s measured, against ~0.4 s of
        # training per seed), and V2 keeps no checkpoint-less metrics: once per seed.
        if epoch == config.epochs - 1:
            ray.train.report({**metrics, "seed": seed})

    states = []
    for seed in loop_config["seeds"]:
        det = fit(arrays, config, seed, progress=False,
                  report=lambda epoch, metrics, seed=seed: report(epoch, metrics, seed))
        states.append(det.state(numpy=True))
    return states


def train_cgmia_seeds_on_ray(train_table: pa.Table, config: CGMIAConfig | None = None,
                             seeds: Iterable[int] = (0,), num_workers: int = 1,
                             storage_path: str | os.PathLike | None = None,
                             run_name: str | None = None) -> list[CGMIADetector]:
    """Train one CGMIA detector per seed on a labelled collection, in one Ray Train run.

    One run for all seeds because starting a run costs more than training (seconds for
    the FFN; the frozen parts are computed once per seed). ``num_workers`` must be 1:
    data parallelism would cost more in all-reduce than it saves. ``storage_path``
    receives Ray Train's run directory.
    """
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if num_workers != 1:
        raise BadInput(f"num_workers={num_workers}: CGMIA trains on one worker (see docstring)")
    config = config or CGMIAConfig()
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise BadInput("no seeds given")
    if not ray.is_initialized():
        raise BadInput("Ray is not initialised; call ray.init() (or connect to a cluster) first")
    storage = Path(storage_path or Path(tempfile.gettempdir()) / "leakray-ray-train").resolve()
    arrays_ref = ray.put(arrays_from_table(train_table))
    name = run_name or f"cgmia-seeds{'-'.join(map(str, seeds[:4]))}-{uuid.uuid4().hex[:8]}"
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"arrays": arrays_ref, "config": config.to_dict(), "seeds": seeds},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=config.device.startswith("cuda")),
        run_config=RunConfig(storage_path=str(storage), name=name),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    if not result.return_value or len(result.return_value) != len(seeds):
        raise RuntimeError(f"Ray Train run in {result.path} returned no detector states")
    return [CGMIADetector.from_state(st, device=config.device) for st in result.return_value]


def train_cgmia_on_ray(train_table: pa.Table, config: CGMIAConfig | None = None, seed: int = 0,
                       num_workers: int = 1, storage_path: str | os.PathLike | None = None,
                       run_name: str | None = None) -> CGMIADetector:
    """Train CGMIA on a labelled collection as one Ray Train (TorchTrainer) run."""
    return train_cgmia_seeds_on_ray(train_table, config, [seed], num_workers=num_workers,
                                    storage_path=storage_path, run_name=run_name)[0]


def _keys(table: pa.Table) -> list[tuple[str, str]]:
    if C.TASK_ID not in table.column_names:
        raise BadInput("collection lacks column", field=C.TASK_ID)
    ids = table.column(C.TASK_ID).to_pylist()
    bench = table.column(C.BENCHMARK).to_pylist() if C.BENCHMARK in table.column_names else [""] * len(ids)
    return list(zip(bench, ids))


def _labels(table: pa.Table, which: str) -> np.ndarray:
    y = scalar_column(table, C.MEMBER, dtype=np.int8)
    bad = ~np.isin(y, (0, 1))
    if bad.any():
        raise BadInput(f"{which} collection needs member 0/1 to be evaluated, got {y[bad][0]}",
                       row=int(np.flatnonzero(bad)[0]), field=C.MEMBER)
    return y


def evaluate_detectors(shadow_table: pa.Table, target_table: pa.Table, config: CGMIAConfig | None = None,
                       seeds: Iterable[int] = (0, 1, 2, 3, 4), *, use_ray_train: bool = False,
                       storage_path: str | os.PathLike | None = None, allow_task_overlap: bool = False,
                       baselines: Iterable[str] = tuple(BASELINES), progress: bool = False,
                       save_dir: str | os.PathLike | None = None
                       ) -> dict[str, Any]:
    """Train CGMIA on the shadow collection per seed, score the target, compare with baselines.

    With ``use_ray_train`` all seeds train in one Ray Train run (Ray must be initialised).

    Returns ``{"per_seed": {detector: [metrics, ...]}, "median": {detector: median_over_repeats},
    "seeds": [...], "scores": pa.Table (SCORES_SCHEMA, one row per task per detector per seed)}``.
    Baselines are seed-free: computed once, stored with S.SEED = BASELINE_SEED, and their
    "median" is over that single run. Shadow and target must not share a (benchmark, task_id)
    unless ``allow_task_overlap`` (splits are by task).
    """
    config = config or CGMIAConfig()
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise BadInput("no seeds given")
    _labels(shadow_table, "shadow")
    y = _labels(target_table, "target")
    shadow_keys, target_keys = _keys(shadow_table), _keys(target_table)
    overlap = set(shadow_keys) & set(target_keys)
    if overlap and not allow_task_overlap:
        raise BadInput(f"{len(overlap)} tasks are in both shadow and target, e.g. {sorted(overlap)[:3]}; "
                       "split by task or pass allow_task_overlap=True", field=C.TASK_ID)
    task_ids = [t for _, t in target_keys]
    target_arrays = arrays_from_table(target_table)
    shadow_arrays = None if use_ray_train else arrays_from_table(shadow_table)

    per_seed: dict[str, list[dict]] = {CGMIA: []}
    parts: list[pa.Table] = []

    def add_scores(name: str, seed: int, score: np.ndarray, pred: np.ndarray) -> None:
        parts.append(pa.table({
            S.TASK_ID: task_ids, S.DETECTOR: [name] * len(task_ids),
            S.SEED: np.full(len(task_ids), seed, np.int64), S.SCORE: np.asarray(score, np.float64),
            S.PREDICTION: np.asarray(pred, np.int8), S.MEMBER: y,
        }, schema=SCORES_SCHEMA))

    if use_ray_train:
        detectors = train_cgmia_seeds_on_ray(shadow_table, config, seeds, storage_path=storage_path)
    else:
        detectors = [fit(shadow_arrays, config, seed, progress=progress) for seed in seeds]
    for seed, det in zip(seeds, detectors):
        if save_dir is not None:  # frozen projections and scaler travel with the weights
            det.save(Path(save_dir) / f"cgmia-seed{seed}")
        proba = det.predict_proba(target_arrays)
        pred = (proba >= 0.5).astype(np.int8)
        per_seed[CGMIA].append(binary_metrics(y, proba, pred))  # aligned with "seeds"
        add_scores(CGMIA, seed, proba, pred)

    for name in baselines:
        if name not in BASELINES:
            raise BadInput(f"unknown baseline {name!r}; known: {sorted(BASELINES)}")
        out = BASELINES[name](target_table)
        per_seed[name] = [binary_metrics(y, out[S.SCORE], out[S.PREDICTION])]
        add_scores(name, BASELINE_SEED, out[S.SCORE], out[S.PREDICTION])

    return {
        "per_seed": per_seed,
        "median": {name: median_over_repeats(ms) for name, ms in per_seed.items()},
        "seeds": seeds,
        "scores": pa.concat_tables(parts),
    }


def scores_to_dict(result: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-friendly part of an ``evaluate_detectors`` result (drops the scores table)."""
    return {k: v for k, v in result.items() if k != "scores"}
