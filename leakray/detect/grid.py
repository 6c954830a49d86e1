"""Grid search for detectors that tune hyper-parameters on the shadow: the grid, the trials
in-process, and the choice per model and seed. Where the trials run is the caller's choice:
``leakray.executor.tune.tune_trials`` runs the same trials as one Ray Tune run (same
``Trials`` result), so this module never imports Ray."""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Iterable, Mapping

from leakray.errors import BadInput

FitEval = Callable[[Mapping[str, Any], int, Any], float]  # (params, seed, data) -> validation AUC
Trials = dict[int, dict[str, float]]  # grid point index -> {"val_auc_<seed>", "seconds_<seed>"}
# (fit_eval, points, seeds, data, *, name, storage_path) -> Trials
TrialRunner = Callable[..., Trials]


def grid_points(grid: Mapping[str, list], **fixed: Any) -> list[dict[str, Any]]:
    """The cartesian product in a fixed order (keys sorted, values as given), plus ``fixed``."""
    keys = sorted(grid)
    for k in keys:
        if not isinstance(grid[k], (list, tuple)) or not grid[k]:
            raise BadInput(f"grid for {k!r} must be a non-empty list", field=f"tune.grid.{k}")
    return [{**fixed, **dict(zip(keys, values))} for values in itertools.product(*(grid[k] for k in keys))]


def trial_metrics(params: Mapping[str, Any], fit_eval: FitEval, data: Any, seeds: list[int]) -> dict[str, float]:
    """One grid point fitted once per seed: what a trial reports, wherever it runs."""
    metrics: dict[str, float] = {}
    for s in seeds:
        t0 = time.perf_counter()
        metrics[f"val_auc_{s}"] = float(fit_eval(params, s, data))
        metrics[f"seconds_{s}"] = time.perf_counter() - t0
    return metrics


def local_trials(fit_eval: FitEval, points: list[Mapping[str, Any]], seeds: Iterable[int], data: Any,
                 **_: Any) -> Trials:
    """Every grid point in this process, one after the other (small grids, no cluster)."""
    seeds = [int(s) for s in seeds]
    return {i: trial_metrics(p, fit_eval, data, seeds) for i, p in enumerate(points)}


def choose(points: list[Mapping[str, Any]], trials: Trials, seeds: Iterable[int],
           group_key: str | None = None) -> dict[Any, list[dict[str, Any]]]:
    """``{group: [per seed {"seed", "chosen", "val_auc", "trials": [{"params", "val_auc",
    "seconds"}, ...]}]}`` where a group is the points sharing ``point[group_key]`` (one group,
    key None, without a ``group_key``): one search can cover several models' grids, each model
    choosing among its own points by validation AUC (ties, and NaN last: the earlier point)."""
    seeds = [int(s) for s in seeds]
    if sorted(trials) != list(range(len(points))):
        raise RuntimeError(f"the grid search returned {len(trials)} of {len(points)} grid points")
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault(p.get(group_key) if group_key else None, []).append(i)
    out: dict[Any, list[dict[str, Any]]] = {}
    for group, idx in groups.items():
        out[group] = []
        for s in seeds:
            aucs = {i: float(trials[i][f"val_auc_{s}"]) for i in idx}
            best = max(idx, key=lambda i: (aucs[i] if aucs[i] == aucs[i] else -1.0, -i))
            out[group].append({"seed": s, "chosen": dict(points[best]), "val_auc": aucs[best], "trials": [
                {"params": dict(points[i]), "val_auc": aucs[i], "seconds": float(trials[i][f"seconds_{s}"])}
                for i in idx]})
    return out
