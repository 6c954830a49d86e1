"""Grid search on Ray Tune for the detectors that tune hyper-parameters on the shadow.

One Tune run covers every seed and can cover several models: a trial is one grid point
(a model and its hyper-parameters), fits it once per seed on that seed's training split
of the shadow and reports each seed's validation AUC (``val_auc_<seed>``). Each model and
seed then gets its grid point with the best validation AUC on that seed's split (ties: the
earlier point in grid order). The target collection never reaches this module.

One run for everything because starting a Tune run and its trial actors costs far more
than fitting a small scikit-learn model on ~100 rows (measured: 20-40 s per run on a
loaded 2-core machine, against milliseconds per fit).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping

from leakray.errors import BadInput


# The new console output ignores ``verbose=0`` and prints a box per run; the classic one obeys it.
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

from leakray.detect.grid import FitEval, Trials, choose, trial_metrics
from leakray.executor.runtime import ensure_ray


def _trial(config: dict, fit_eval: FitEval, data: Any, seeds: list[int], points: list[dict]) -> dict:
    from ray import tune

    metrics = trial_metrics(points[config["point"]], fit_eval, data, seeds)
    tune.report(metrics)
    return metrics


def tune_trials(fit_eval: FitEval, points: list[Mapping[str, Any]], seeds: Iterable[int], data: Any, *,
                name: str = "grid", storage_path: str | os.PathLike | None = None,
                num_cpus: int | None = None) -> Trials:
    """Run every grid point as a trial of one Ray Tune run (``tune.grid_search`` over the
    points); the same result as ``detect.grid.local_trials``. ``fit_eval`` must be importable
    (it runs in Tune's workers); ``data`` travels once through the object store. Starts a
    local Ray if none is running."""
    from ray import tune

    seeds = [int(s) for s in seeds]
    points = [dict(p) for p in points]
    if not seeds or not points:
        raise BadInput("a grid search needs at least one seed and one grid point")
    ensure_ray(num_cpus=num_cpus, verbose=False)
    from leakray.storage import ray_storage

    storage = Path(storage_path or Path(tempfile.gettempdir()) / "leakray-ray-tune").resolve()
    trainable = tune.with_parameters(_trial, fit_eval=fit_eval, data=data, seeds=seeds, points=points)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"point": tune.grid_search(list(range(len(points))))},
        # a trial is milliseconds of scikit-learn; a fresh actor per trial would re-import it
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(name=f"{name}-{uuid.uuid4().hex[:8]}", verbose=0, **ray_storage(storage)),
    )
    results = tuner.fit()
    by_point: dict[int, dict] = {}
    for r in results:
        if r.error is not None:
            raise RuntimeError(f"Tune trial {r.config} of {name} failed: {r.error}") from r.error
        by_point[int(r.config["point"])] = r.metrics
    return by_point


def tune_grid(fit_eval: FitEval, points: list[Mapping[str, Any]], seeds: Iterable[int], data: Any, *,
              group_key: str | None = None, **run: Any) -> dict[Any, list[dict[str, Any]]]:
    """``tune_trials`` then ``detect.grid.choose``: the best point per group and seed."""
    return choose(points, tune_trials(fit_eval, points, seeds, data, **run), seeds, group_key)
