"""Detectors on Ray: CGMIA training as a Ray Train run, and the shadow -> target evaluation.

Every detector's decision threshold is chosen on the shadow collection by a named rule
(``leakray.evaluate.thresholds``) and applied unchanged to the target: the baselines'
on their shadow scores, CGMIA's on cross-fitted out-of-fold shadow probabilities
(``leakray.detect.cgmia.fit_thresholded``). The target's labels only score the result.

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
from leakray.detect.cgmia import (
    CROSS_FIT_FOLDS,
    CGMIAConfig,
    CGMIADetector,
    arrays_from_table,
    fit,
    fit_thresholded,
)
from leakray.errors import BadInput
from leakray.evaluate.metrics import BOOTSTRAP_SEED, N_BOOTSTRAP, binary_metrics, median_over_repeats
from leakray.evaluate.thresholds import DEFAULT_RULE, apply_threshold, choose_threshold, parse_rule
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
        parse_rule(threshold_rule)
    if not ray.is_initialized():
        raise BadInput("Ray is not initialised; call ray.init() (or connect to a cluster) first")
    storage = Path(storage_path or Path(tempfile.gettempdir()) / "leakray-ray-train").resolve()
    arrays_ref = ray.put(arrays_from_table(train_table))
    name = run_name or f"cgmia-seeds{'-'.join(map(str, seeds[:4]))}-{uuid.uuid4().hex[:8]}"
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"arrays": arrays_ref, "config": config.to_dict(), "seeds": seeds,
                           "threshold_rule": threshold_rule, "threshold_folds": int(threshold_folds)},
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
                       save_dir: str | os.PathLike | None = None, threshold_rule: str = DEFAULT_RULE,
                       threshold_folds: int = CROSS_FIT_FOLDS, bootstrap: int = N_BOOTSTRAP,
                       bootstrap_seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Train CGMIA on the shadow collection per seed, score the target, compare with baselines.

    Decisions: every detector's threshold is chosen on the shadow by ``threshold_rule``
    (see module doc; CGMIA's over ``threshold_folds`` cross-fitted folds) and applied to
    the target. Intervals: ``bootstrap`` stratified resamples (0: none) of the target, seeded by
    ``bootstrap_seed`` (the same resamples for every detector and seed).
    With ``use_ray_train`` all seeds train in one Ray Train run (Ray must be initialised).

    Returns ``{"per_seed": {detector: [metrics, ...]}, "median": {detector: median_over_repeats},
    "thresholds": {detector: {"rule", "chosen_on", "values": [per seed]}}, "threshold_rule",
    "bootstrap": {"n_resamples", "seed"}, "seeds": [...], "scores": pa.Table (SCORES_SCHEMA,
    one row per task per detector per seed)}``; each per-seed metrics dict also holds its
    ``"threshold"`` (``Threshold.to_dict()``: rule, value, chosen_on and the shadow's
    tpr/fpr/mcc at the cut). Baselines are seed-free: computed once, stored with
    S.SEED = BASELINE_SEED, and their "median" is over that single run. Shadow and
    target must not share a (benchmark, task_id) unless ``allow_task_overlap``.
    """
    config = config or CGMIAConfig()
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise BadInput("no seeds given")
    parse_rule(threshold_rule)
    baselines = list(baselines)
    for name in baselines:
        if name not in BASELINES:
            raise BadInput(f"unknown baseline {name!r}; known: {sorted(BASELINES)}")
    y_shadow = _labels(shadow_table, "shadow")
    y = _labels(target_table, "target")
    shadow_keys, target_keys = _keys(shadow_table), _keys(target_table)
    overlap = set(shadow_keys) & set(target_keys)
    if overlap and not allow_task_overlap:
        raise BadInput(f"{len(overlap)} tasks are in both shadow and target, e.g. {sorted(overlap)[:3]}; "
                       "split by task or pass allow_task_overlap=True", field=C.TASK_ID)
    task_ids = [t for _, t in target_keys]
    target_arrays = arrays_from_table(target_table)
    boot = {"n_bootstrap": int(bootstrap), "bootstrap_seed": int(bootstrap_seed)}

    per_seed: dict[str, list[dict]] = {CGMIA: []}
    thresholds: dict[str, dict] = {}
    parts: list[pa.Table] = []

    def add_scores(name: str, seed: int, score: np.ndarray, pred: np.ndarray) -> None:
        parts.append(pa.table({
            S.TASK_ID: task_ids, S.DETECTOR: [name] * len(task_ids),
            S.SEED: np.full(len(task_ids), seed, np.int64), S.SCORE: np.asarray(score, np.float64),
            S.PREDICTION: np.asarray(pred, np.int8), S.MEMBER: y,
        }, schema=SCORES_SCHEMA))

    def add_threshold(name: str, th: Mapping[str, Any]) -> None:
        entry = thresholds.setdefault(name, {"rule": th["rule"], "chosen_on": th["chosen_on"], "values": []})
        entry["values"].append(th["value"])

    if use_ray_train:
        detectors = train_cgmia_seeds_on_ray(shadow_table, config, seeds, storage_path=storage_path,
                                             threshold_rule=threshold_rule, threshold_folds=threshold_folds)
    else:
        shadow_arrays = arrays_from_table(shadow_table)
        detectors = [fit_thresholded(shadow_arrays, config, seed, threshold_rule, threshold_folds,
                                     progress=progress) for seed in seeds]
    for seed, det in zip(seeds, detectors):
        if save_dir is not None:  # frozen projections, scaler and threshold travel with the weights
            det.save(Path(save_dir) / f"cgmia-seed{seed}")
        proba = det.predict_proba(target_arrays)
        pred = (proba >= det.threshold["value"]).astype(np.int8)
        per_seed[CGMIA].append({**binary_metrics(y, proba, pred, **boot), "threshold": det.threshold})
        add_threshold(CGMIA, det.threshold)
        add_scores(CGMIA, seed, proba, pred)

    skipped: dict[str, str] = {}
    for name in baselines:
        try:  # an input missing for some rows (a NaN reference loss) skips the detector, named
            shadow_score, score = BASELINES[name](shadow_table), BASELINES[name](target_table)
        except BadInput as exc:
            skipped[name] = f"input unusable: {exc}"
            continue
        th = choose_threshold(y_shadow, shadow_score, threshold_rule, chosen_on="shadow").to_dict()
        pred = apply_threshold(score, th["value"])
        per_seed[name] = [{**binary_metrics(y, score, pred, **boot), "threshold": th}]
        add_threshold(name, th)
        add_scores(name, BASELINE_SEED, score, pred)

    return {
        "per_seed": per_seed,
        "median": {name: median_over_repeats(ms) for name, ms in per_seed.items()},
        "thresholds": thresholds,
        "skipped": skipped,
        "threshold_rule": threshold_rule,
        "bootstrap": {"n_resamples": int(bootstrap), "seed": int(bootstrap_seed)},
        "seeds": seeds,
        "scores": pa.concat_tables(parts),
    }


def scores_to_dict(result: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-friendly part of an ``evaluate_detectors`` result (drops the scores table)."""
    return {k: v for k, v in result.items() if k != "scores"}
