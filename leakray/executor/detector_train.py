"""CGMIA training as one Ray Train run (TorchTrainer) over all seeds.

Ray Train V2 (default in Ray 2.60) keeps reported metrics only together with a
checkpoint, so the trained detector comes back as rank 0's return value
(``Result.return_value``): a plain state dict, a few MB for d=768.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import ray

from leakray.detect.cgmia import CROSS_FIT_FOLDS, CGMIAConfig, CGMIADetector, arrays_from_table, fit, fit_thresholded
from leakray.errors import BadInput
from leakray.evaluate.thresholds import DEFAULT_RULE, ThresholdRule


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

    rule, folds = loop_config["threshold_rule"], loop_config["threshold_folds"]
    states = []
    for seed in loop_config["seeds"]:
        on_epoch = lambda epoch, metrics, seed=seed: report(epoch, metrics, seed)  # noqa: E731
        det = fit(arrays, config, seed, progress=False, report=on_epoch) if rule is None else \
            fit_thresholded(arrays, config, seed, rule, folds, progress=False, report=on_epoch)
        states.append(det.state(numpy=True))
    return states


def train_cgmia_seeds_on_ray(train_table: pa.Table, config: CGMIAConfig | None = None,
                             seeds: Iterable[int] = (0,), num_workers: int = 1,
                             storage_path: str | os.PathLike | None = None,
                             run_name: str | None = None, threshold_rule: str | None = DEFAULT_RULE,
                             threshold_folds: int = CROSS_FIT_FOLDS) -> list[CGMIADetector]:
    """Train one CGMIA detector per seed on a labelled collection, in one Ray Train run.

    With a ``threshold_rule`` each detector also gets its decision threshold from
    cross-fitting on the same rows (``fit_thresholded``); ``None`` trains without one.

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
    if threshold_rule is not None:
        threshold_rule = ThresholdRule(threshold_rule)
    if not ray.is_initialized():
        raise BadInput("Ray is not initialised; call ray.init() (or connect to a cluster) first")
    from leakray.storage import ray_storage

    storage = Path(storage_path or Path(tempfile.gettempdir()) / "leakray-ray-train").resolve()
    arrays_ref = ray.put(arrays_from_table(train_table))
    name = run_name or f"cgmia-seeds{'-'.join(map(str, seeds[:4]))}-{uuid.uuid4().hex[:8]}"
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"arrays": arrays_ref, "config": config.to_dict(), "seeds": seeds,
                           "threshold_rule": threshold_rule, "threshold_folds": int(threshold_folds)},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=config.device.startswith("cuda")),
        run_config=RunConfig(name=name, **ray_storage(storage)),
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
