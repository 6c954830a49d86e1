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

import itertools
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from leakray.errors import BadInput


# The new console output ignores ``verbose=0`` and prints a box per run; the classic one obeys it.
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

FitEval = Callable[[Mapping[str, Any], int, Any], float]  # (params, seed, data) -> validation AUC


def grid_points(grid: Mapping[str, list], **fixed: Any) -> list[dict[str, Any]]:
    """The cartesian product in a fixed order (keys sorted, values as given), plus ``fixed``."""
    keys = sorted(grid)
    for k in keys:
        if not isinstance(grid[k], (list, tuple)) or not grid[k]:
            raise BadInput(f"grid for {k!r} must be a non-empty list", field=f"tune.grid.{k}")
    return [{**fixed, **dict(zip(keys, values))} for values in itertools.product(*(grid[k] for k in keys))]


def _trial(config: dict, fit_eval: FitEval, data: Any, seeds: list[int], points: list[dict]) -> dict:
    from ray import tune

    params = points[config["point"]]
    metrics: dict[str, float] = {}
    for s in seeds:
        t0 = time.perf_counter()
        metrics[f"val_auc_{s}"] = float(fit_eval(params, s, data))
        metrics[f"seconds_{s}"] = time.perf_counter() - t0
    tune.report(metrics)
    return metrics


def _ensure_ray(num_cpus: int | None) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)


def tune_grid(fit_eval: FitEval, points: list[Mapping[str, Any]], seeds: Iterable[int], data: Any, *,
              group_key: str | None = None, name: str = "grid", storage_path: str | os.PathLike | None = None,
              num_cpus: int | None = None) -> dict[Any, list[dict[str, Any]]]:
    """Run every grid point on Ray Tune (``tune.grid_search`` over the points).

    Returns ``{group: [per seed {"seed", "chosen", "val_auc", "trials": [{"params",
    "val_auc", "seconds"}, ...]}]}`` where a group is the points sharing ``point[group_key]``
    (one group, key None, without a ``group_key``): one Tune run can search several models'
    grids, each model choosing among its own points. ``fit_eval`` must be importable (it runs
    in Tune's workers); ``data`` travels once through the object store. Starts a local Ray
    if none is running."""
    from ray import tune

    seeds = [int(s) for s in seeds]
    points = [dict(p) for p in points]
    if not seeds or not points:
        raise BadInput("a grid search needs at least one seed and one grid point")
    _ensure_ray(num_cpus)
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
    if sorted(by_point) != list(range(len(points))):
        raise RuntimeError(f"Tune run {name} returned {len(by_point)} of {len(points)} grid points")
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault(p.get(group_key) if group_key else None, []).append(i)
    out: dict[Any, list[dict[str, Any]]] = {}
    for group, idx in groups.items():
        out[group] = []
        for s in seeds:
            aucs = {i: float(by_point[i][f"val_auc_{s}"]) for i in idx}
            # the best validation AUC; ties (and NaN last): the earlier grid point
            best = max(idx, key=lambda i: (aucs[i] if aucs[i] == aucs[i] else -1.0, -i))
            out[group].append({"seed": s, "chosen": points[best], "val_auc": aucs[best], "trials": [
                {"params": points[i], "val_auc": aucs[i], "seconds": float(by_point[i][f"seconds_{s}"])}
                for i in idx]})
    return out
