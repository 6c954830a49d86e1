"""The shadow -> target evaluation of every detector (CGMIA, the baselines, the learned ones).

Every detector's decision threshold is chosen on the shadow collection by a named rule
(``leakray.evaluate.thresholds``) and applied unchanged to the target: the baselines'
on their shadow scores, CGMIA's on cross-fitted out-of-fold shadow probabilities
(``leakray.detect.cgmia.fit_thresholded``). The target's labels only score the result.
CGMIA's Ray Train run lives in ``leakray.executor.detector_train``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import scalar_column
from leakray.detect.cgmia import (
    CROSS_FIT_FOLDS,
    CGMIAConfig,
    arrays_from_table,
    fit_thresholded,
)
from leakray.errors import BadInput
from leakray.executor.detector_train import train_cgmia_seeds_on_ray
from leakray.evaluate.metrics import BOOTSTRAP_SEED, N_BOOTSTRAP, binary_metrics, median_over_repeats
from leakray.evaluate.thresholds import DEFAULT_RULE, ThresholdRule, apply_threshold
from leakray.parts import PartClock, per_second
from leakray.schema import C, S

CGMIA = "cgmia"
BASELINE_SEED = S.BASELINE_SEED

# schema.collection_schema is a twin in shape only: the collection is another table, whose first
# column names these share (S.TASK_ID = T.TASK_ID, S.MEMBER = C.MEMBER).
SCORES_SCHEMA = pa.schema([
    (S.TASK_ID, pa.string()),
    (S.DETECTOR, pa.string()),
    (S.SEED, pa.int64()),
    (S.SCORE, pa.float64()),
    (S.PREDICTION, pa.int8()),
    (S.MEMBER, pa.int8()),
])


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


DEFAULT_DETECTORS = ("cgmia", "detectleak", "ref_loss", "gt_match")  # the pre-registry set


COST_NOTE = ("wall_s: fit + threshold + target scoring, all seeds (summed over the tasks when a detector's seeds "
             "ran as separate tasks). peak_rss_mb: the largest growth of the resident set of the process that ran "
             "it (numpy, torch and native libraries included; the kernel's high-water mark, exact, where the "
             "detector was the only one measured in its process; otherwise sampled every 10 ms, so a shorter "
             "peak can be missed; the largest over its seed tasks; peak_rss_how says which). py_peak_mb, with "
             "detect.trace_memory only: tracemalloc's peak of Python-level allocations (numpy counted, torch "
             "tensors not; it makes fitting ~2x as costly in CPU). Work in Ray Train and Tune runs is in neither memory figure: their groups report "
             "the driver's side. With parallel, the groups run from the driver (the Tune search; CGMIA, which "
             "on CPUs fits in the driver) run side by side in its threads, so their peak_rss_mb share one "
             "process and their py_peak_mb is null (tracemalloc is process-wide). trial_s sums a Tune-searched model's trial fit "
             "times, and shared_run names detectors whose wall time is one shared run (a Tune search, or CGMIA's "
             "fits that cgmia_ensemble reuses). part_seconds: that wall time split into fit, threshold (a learned "
             "detector's cross-fitting included), score and metrics (the bootstrap intervals); a Tune search's fit "
             "is its trials' own seconds, not its wall time.")


class _Cost:
    """Wall time and peak memory of one detector's fit + threshold + scoring (see COST_NOTE)."""

    def __init__(self, trace: bool):
        self.trace = trace

    def __enter__(self) -> "_Cost":
        import time
        import tracemalloc

        from leakray.protocols.rss_peak import RssPeak

        self._started_tracing = self.trace and not tracemalloc.is_tracing()
        if self._started_tracing:
            tracemalloc.start()
        elif self.trace:
            tracemalloc.reset_peak()
        self._rss = RssPeak().__enter__()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        import time
        import tracemalloc

        self.wall_s = time.perf_counter() - self._t0
        self._rss.__exit__(*exc)
        self.peak_rss_mb = self._rss.mb
        self.py_peak_mb = tracemalloc.get_traced_memory()[1] / 2**20 if self.trace else None
        if self._started_tracing:
            tracemalloc.stop()

    def to_dict(self, **extra: Any) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 3), "peak_rss_mb": _round(self.peak_rss_mb),
                "peak_rss_how": self._rss.how, "py_peak_mb": _round(self.py_peak_mb), **extra}


def _round(mb: float | None) -> float | None:
    return None if mb is None else round(mb, 2)


def _larger(a: float | None, b: float | None) -> float | None:
    return a if b is None else b if a is None else max(a, b)


def _summed(*parts: Mapping[str, float] | None) -> dict[str, float]:
    clock = PartClock()
    for p in parts:
        clock.merge(p)
    return clock.rounded()


def _how(a: str | None, b: str | None) -> str | None:
    """How two seed tasks' merged peak was read: exact only if both were."""
    return "sampled" if "sampled" in (a, b) else a


def fit_and_score(job: tuple[list[str], list[int]], shadow: pa.Table, target: pa.Table,
                  params: Mapping[str, Mapping[str, Any]], context, trace_memory: bool, boot: dict) -> dict:
    """One job: a group of detectors (one detector, or those fitted by one shared run) and the
    seeds it fits: fit on the shadow, thresholds on shadow rows, target scores and metrics. Runs
    here or as a Ray task; {"members", "rows": {name: [per seed {"detector", "threshold", "score",
    "prediction", "metrics"}]}, "cost"}, or {"members", "skipped": why}: all its seeds or none."""
    from leakray.detect import registry

    members, seeds = job
    cls = registry.detector_class(members[0])
    y = _labels(target, "target")
    clock = PartClock()
    try:
        with _Cost(trace_memory) as cost:
            with clock.part("fit"):
                if not cls.spec.learns:
                    fitted = {members[0]: [cls(**params.get(members[0], {})).fit(shadow, BASELINE_SEED)]}
                elif cls.group:
                    fitted = cls.fit_group(members, shadow, seeds, params, context)
                else:
                    fitted = {members[0]: cls.fit_seeds(shadow, seeds, params.get(members[0]), context)}
            rows: dict[str, list[dict]] = {}
            for name in members:
                rows[name] = []
                for det in fitted[name]:
                    with clock.part("threshold"):  # a learned detector's cross-fitting is here
                        th = det.threshold(shadow, context.threshold_rule)
                    with clock.part("score"):
                        score = det.score(target)
                        pred = apply_threshold(score, th["value"])
                    with clock.part("metrics"):  # the bootstrap intervals
                        metrics = binary_metrics(y, score, pred, **boot)
                    rows[name].append({"detector": det, "threshold": th, "score": score, "prediction": pred,
                                       "metrics": metrics})
    except BadInput as exc:
        return {"members": members, "skipped": f"input unusable: {exc}"}
    trials = [det.info.get("trial_seconds") for dets in fitted.values() for det in dets]
    if cls.spec.fit == "ray_tune" and trials and None not in trials:
        # the search's wall time here is mostly its trials waiting for a CPU: its work is theirs
        clock.seconds["fit"] = sum(trials)
    return {"members": members, "rows": rows, "cost": {**cost.to_dict(), "part_seconds": clock.rounded()}}


def _merge_seed_jobs(outcomes: list[dict]) -> list[dict]:
    """One outcome per group: the per-seed jobs of one detector joined in seed order (any
    seed skipped skips the detector); their costs add up (wall time: summed over the tasks,
    memory: the largest)."""
    merged: dict[tuple, dict] = {}
    for out in outcomes:
        key = tuple(out["members"])
        have = merged.get(key)
        if have is None:
            merged[key] = {**out, **({"rows": {n: list(r) for n, r in out["rows"].items()}} if "rows" in out else {})}
        elif "skipped" in have:
            continue
        elif "skipped" in out:
            merged[key] = out
        else:
            for name, rows in out["rows"].items():
                have["rows"][name] += rows
            cost, more = have["cost"], out["cost"]
            have["cost"] = {"wall_s": round(cost["wall_s"] + more["wall_s"], 3),
                            "part_seconds": _summed(cost.get("part_seconds"), more.get("part_seconds")),
                            "peak_rss_mb": _larger(cost.get("peak_rss_mb"), more.get("peak_rss_mb")),
                            "py_peak_mb": _larger(cost.get("py_peak_mb"), more.get("py_peak_mb")),
                            "peak_rss_how": _how(cost.get("peak_rss_how"), more.get("peak_rss_how"))}
    return list(merged.values())  # a detector's seed jobs come back in the order they were submitted


def plan_jobs(groups: list[list[str]], seeds: list[int], parallel: bool) -> tuple[list, list]:
    """(jobs spread out as Ray tasks, jobs run from the driver); a job is (members, seeds). See
    the comment where ``evaluate_detectors`` calls it."""
    from leakray.detect import registry

    spread, driver = [], []
    for members in groups:
        fits = {registry.spec(m).fit for m in members}  # a group with a Ray Train/Tune member runs it from here
        fit = fits.pop() if len(fits) == 1 else "mixed"
        if not parallel or fit not in ("none", "local"):
            driver.append((members, seeds))
        elif fit == "local" and len(members) == 1 and not registry.detector_class(members[0]).seeds_together:
            spread += [(members, [s]) for s in seeds]
        else:
            spread.append((members, seeds))
    spread.sort(key=lambda job: registry.spec(job[0][0]).fit != "local")  # stable: report order within
    return spread, driver


def evaluate_detectors(shadow_table: pa.Table, target_table: pa.Table, config: CGMIAConfig | None = None,
                       seeds: Iterable[int] = (0, 1, 2, 3, 4), *, detectors: str | Iterable[str] = DEFAULT_DETECTORS,
                       detector_params: Mapping[str, Mapping[str, Any]] | None = None,
                       use_ray_train: bool = False, storage_path: str | os.PathLike | None = None,
                       allow_task_overlap: bool = False, progress: bool = False,
                       save_dir: str | os.PathLike | None = None, threshold_rule: str = DEFAULT_RULE,
                       threshold_folds: int = CROSS_FIT_FOLDS, bootstrap: int = N_BOOTSTRAP,
                       bootstrap_seed: int = BOOTSTRAP_SEED, trace_memory: bool = False,
                       expert_ablation: bool = False, parallel: bool = False,
                       copy_groups: Iterable[Iterable[str]] = (), tally=None) -> dict[str, Any]:
    """Fit every requested detector on the shadow collection, score the target, compare.

    ``detectors``: registry names (``leakray.detect.registry``) or ``"all"``. A detector
    whose input columns are absent or all-null in either collection is not run: it is in
    ``"skipped"`` with the reason (so are detectors whose input is unusable in some row).
    ``detector_params``: per-name constructor parameters (e.g. ``{"min_k": {"k": 0.1}}``);
    CGMIA takes ``config``. Seed-free detectors run once; learned ones once per seed.

    Decisions: every detector's threshold is chosen on shadow data by ``threshold_rule``
    and applied to the target: score-only detectors on all shadow rows, learned ones on
    shadow rows they did not train on (CGMIA: ``threshold_folds`` cross-fitted folds;
    others: their validation split; see each detector's ``heldout``). Intervals:
    ``bootstrap`` stratified resamples (0: none) of the target, seeded by
    ``bootstrap_seed`` (the same resamples for every detector and seed). With
    ``use_ray_train`` CGMIA's seeds train in one Ray Train run (Ray must be initialised);
    the classic models (lr, rf, svm, nb, dt, mlp) are grid-searched in one Ray Tune run
    (Ray is started if it is not running). With ``parallel`` the detectors that fit in-process
    run side by side as Ray tasks, one CPU each (results identical: each detector seeds itself).

    Returns ``{"per_seed": {detector: [metrics, ...]}, "median": {detector:
    median_over_repeats}, "thresholds": {detector: {"rule", "chosen_on", "values": [per
    seed]}}, "skipped": {detector: reason}, "costs": {detector: {"wall_s", "peak_rss_mb",
    "py_peak_mb", ...}}, "details": {detector: [per seed: what fitting chose]},
    "specs": {detector: spec}, "detectors": [requested], "threshold_rule", "bootstrap":
    {"n_resamples", "seed"}, "seeds": [...], "scores": pa.Table (SCORES_SCHEMA, one row per
    task per detector per seed)}`` and, with ``expert_ablation``, ``"expert_ablation"``
    (see ``expert_ablation``). Each per-seed metrics dict also holds its ``"threshold"``.
    Seed-free detectors are stored with S.SEED = BASELINE_SEED. Shadow and target must not
    share a (benchmark, task_id) unless ``allow_task_overlap``. ``copy_groups``: the benchmark's
    near-copy groups (lists of task ids, `siblings.copy_groups`); a learned detector's inner splits
    keep each on one side (`detect.base.keyed_by_copies`), and the target's intervals draw each whole.
    ``tally``: a `progress.JobTally` that counts the jobs (a detector group and its seeds) as they
    finish, for the stage's progress lines.
    """
    from leakray.detect import registry
    from leakray.detect.base import FitContext, keyed_by_copies, missing_input
    from leakray.evaluate.resample import drawn_whole, group_index
    from leakray.executor.runtime import import_train_and_tune, submit_tasks

    config = config or CGMIAConfig()
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise BadInput("no seeds given")
    threshold_rule = ThresholdRule(threshold_rule)  # a typed rule passes as is; a string is parsed (refused early)
    names = registry.resolve(detectors)
    params = {k: dict(v or {}) for k, v in (detector_params or {}).items()}
    for name in params:
        registry.detector_class(name)  # refuse unknown names early
    _labels(shadow_table, "shadow")  # refused here, before any work; detectors read them from the table
    y = _labels(target_table, "target")
    shadow_keys, target_keys = _keys(shadow_table), _keys(target_table)
    overlap = set(shadow_keys) & set(target_keys)
    if overlap and not allow_task_overlap:
        raise BadInput(f"{len(overlap)} tasks are in both shadow and target, e.g. {sorted(overlap)[:3]}; "
                       "split by task or pass allow_task_overlap=True", field=C.TASK_ID)
    task_ids = [t for _, t in target_keys]
    copy_groups = [list(g) for g in copy_groups]
    shadow_table = keyed_by_copies(shadow_table, copy_groups)  # task ids checked above
    # the target's intervals draw a near-copy group whole (`evaluate.resample`); none: as before
    units = group_index(task_ids, copy_groups)
    boot = {"n_bootstrap": int(bootstrap), "bootstrap_seed": int(bootstrap_seed), "groups": units.tolist()}

    per_seed: dict[str, list[dict]] = {}
    thresholds: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    costs: dict[str, dict] = {}
    details: dict[str, list] = {}
    parts: list[pa.Table] = []

    runnable = []
    for name in names:
        spec = registry.spec(name)
        why = missing_input(shadow_table, spec.columns) or missing_input(target_table, spec.columns)
        if why:
            skipped[name] = why
        else:
            runnable.append(name)

    # where learned detectors fit is chosen here, never by them: one Ray Tune run for a grid
    # search, one Ray Train run for every seed of a ray_train detector (or in-process)
    from leakray.executor.tune import tune_trials

    context = FitContext(storage_path=storage_path, trials=tune_trials,
                         train_seeds=train_cgmia_seeds_on_ray if use_ray_train else None,
                         threshold_rule=threshold_rule, progress=progress)
    params.setdefault(CGMIA, {}).setdefault("config", config.to_dict())
    params[CGMIA].setdefault("folds", threshold_folds)
    groups: dict[str, list[str]] = {}  # a group's detectors are fitted by one call (one shared run)
    for name in runnable:
        groups.setdefault(registry.detector_class(name).group or name, []).append(name)

    # groups whose fit runs in this process (none, local) run side by side as Ray tasks, a
    # learned one's seeds as separate tasks (each detector seeds itself: the results are the
    # same; all in one task for a detector that ``seeds_together``), learned ones first (the
    # longest tasks start first); meanwhile the groups that start their own Ray Train or Tune run
    # are run from here
    spread, driver = plan_jobs(list(groups.values()), seeds, parallel)
    finished = tally.finished if tally is not None else (lambda n=1: None)
    if tally is not None:
        tally.add(len(spread) + len(driver))
    gather = submit_tasks(fit_and_score, spread, shadow_table, target_table, params, context, trace_memory,
                          boot, engine="ray" if spread else "local", env=registry.plugins_env(), on_done=finished)

    def fit_here(job, trace: bool) -> dict:
        out = fit_and_score(job, shadow_table, target_table, params, context, trace, boot)
        finished()
        return out

    if parallel and len(driver) > 1:
        # the driver's groups only wait on their Ray Train / Tune runs: start them all at once,
        # one thread each (tracemalloc is process-wide, so their memory is not traced)
        from concurrent.futures import ThreadPoolExecutor

        import_train_and_tune()
        with ThreadPoolExecutor(len(driver)) as pool:
            outcomes = list(pool.map(lambda job: fit_here(job, False), driver))
    else:
        outcomes = [fit_here(job, trace_memory) for job in driver]
    outcomes += gather()
    merged = sorted(_merge_seed_jobs(outcomes), key=lambda o: runnable.index(o["members"][0]))  # report order
    for out in merged:
        members = out["members"]
        if "skipped" in out:  # an input missing for some rows (a NaN reference loss) skips it, named
            skipped.update({name: out["skipped"] for name in members})
            continue
        for name in members:
            rows = out["rows"][name]
            per_seed[name] = [{**r["metrics"], "threshold": r["threshold"]} for r in rows]
            thresholds[name] = {"rule": rows[0]["threshold"]["rule"], "chosen_on": rows[0]["threshold"]["chosen_on"],
                                "values": [r["threshold"]["value"] for r in rows]}
            details[name] = [r["detector"].info for r in rows]
            for r in rows:
                seed = r["detector"].seed
                parts.append(pa.table({
                    S.TASK_ID: task_ids, S.DETECTOR: [name] * len(task_ids),
                    S.SEED: np.full(len(task_ids), seed, np.int64), S.SCORE: np.asarray(r["score"], np.float64),
                    S.PREDICTION: np.asarray(r["prediction"], np.int8), S.MEMBER: y}, schema=SCORES_SCHEMA))
                if save_dir is not None:
                    r["detector"].save(Path(save_dir) / (f"{name}-seed{seed}" if seed != BASELINE_SEED else name))
            shared = {"shared_run": members} if len(members) > 1 else {}  # a shared run's time is each member's
            trial_s = [d.get("trial_seconds") for d in details[name]]
            if trial_s and all(t is not None for t in trial_s):
                shared["trial_s"] = round(sum(trial_s), 3)
            costs[name] = {**out["cost"], **shared}

    # the stage's parts: summed over the groups (a shared run once), busy seconds wherever they ran
    part_seconds = _summed(*(out["cost"].get("part_seconds") for out in merged if "cost" in out))
    result = {
        "part_seconds": part_seconds,
        "per_seed": per_seed,
        "median": {name: median_over_repeats(ms) for name, ms in per_seed.items()},
        "thresholds": thresholds,
        "skipped": skipped,
        "costs": costs,
        "cost_note": COST_NOTE,
        "details": details,
        "specs": {name: registry.spec(name).to_dict() for name in names},
        "detectors": names,
        "threshold_rule": threshold_rule,
        "bootstrap": {"n_resamples": int(bootstrap), "seed": int(bootstrap_seed),
                      # the target's near-copy groups each drawn as one task
                      "groups_drawn_whole": drawn_whole(units)},
        "seeds": seeds,
        "scores": pa.concat_tables(parts) if parts else SCORES_SCHEMA.empty_table(),
    }
    if expert_ablation:
        result["expert_ablation"] = run_expert_ablation(shadow_table, target_table, config, seeds,
                                                        threshold_rule=threshold_rule,
                                                        threshold_folds=threshold_folds)
    return result


def detect_parts(clock: PartClock, result: Mapping[str, Any]) -> dict:
    """The detect stage's marker entries: its part seconds (the detectors' fit, threshold, score and
    metrics summed over their jobs, and whatever the stage ran beside them, e.g. AdvPrompt's gray-box
    setting and ablation, on ``clock``) and how many detector seeds it fitted and scored per second
    of the detectors' own parts."""
    own = sum(clock.seconds.get(p, 0.0) for p in ("fit", "threshold", "score", "metrics"))
    fitted = sum(len(v) for v in result.get("per_seed", {}).values())
    return {"part_seconds": clock.rounded(), "throughput": {"detector_seeds_per_s": per_second(fitted, own)}}


def run_combined_ablation(shadow_table: pa.Table, target_table: pa.Table, seeds: Iterable[int] = (0,), *,
                          params: Mapping[str, Any] | None = None,
                          threshold_rule: str = DEFAULT_RULE) -> dict[str, dict[str, Any]]:
    """The gain of each input group of ``leakray_combined``: the full detector and one run
    without each group it used; ``{"all" | "without_<group>": {"groups", "median"}}``."""
    from leakray.detect.combined import Combined

    y = _labels(target_table, "target")
    base = dict(params or {})

    def run(groups: list[str]) -> dict[str, Any]:
        ms = []
        for seed in seeds:
            det = Combined(**{**base, "groups": groups}).fit(shadow_table, seed)
            th = det.threshold(shadow_table, threshold_rule)
            score = det.score(target_table)
            ms.append(binary_metrics(y, score, apply_threshold(score, th["value"]), n_bootstrap=0))
        return {"groups": groups, "used": det.info["groups_used"], "median": median_over_repeats(ms)}

    full = run(list(base.get("groups") or Combined.defaults["groups"]))
    out = {"all": full}
    for g in full["used"]:
        rest = [h for h in full["used"] if h != g]
        if rest:
            out[f"without_{g}"] = run(rest)
    return out


def expert_subsets() -> list[tuple[bool, ...]]:
    """All 16 on/off masks over C.EXPERT_BLOCKS, full set first, empty set last."""
    import itertools

    return sorted(itertools.product((True, False), repeat=len(C.EXPERT_BLOCKS)), key=lambda m: (-sum(m), m[::-1]))


def run_expert_ablation(shadow_table: pa.Table, target_table: pa.Table, config: CGMIAConfig | None = None,
                        seeds: Iterable[int] = (0, 1, 2, 3, 4), *, threshold_rule: str = DEFAULT_RULE,
                        threshold_folds: int = CROSS_FIT_FOLDS) -> list[dict[str, Any]]:
    """The paper's RQ2: CGMIA with every subset of the expert blocks (perplexity, CodeBLEU,
    edit distance, pass), the semantic inputs (reference and completion embeddings) kept.
    One entry per subset: ``{"blocks": [names on], "label", "without_pass_only": bool,
    "median": median_over_repeats}``; no bootstrap (16 x seeds fits already)."""
    config = config or CGMIAConfig()
    shadow_arrays, target_arrays = arrays_from_table(shadow_table), arrays_from_table(target_table)
    y = _labels(target_table, "target")
    out = []
    for mask in expert_subsets():
        cfg = CGMIAConfig.from_dict({**config.to_dict(), "expert_blocks": list(mask)})
        runs = []
        for seed in seeds:
            det = fit_thresholded(shadow_arrays, cfg, seed, threshold_rule, threshold_folds)
            score = det.predict_log_odds(target_arrays)  # the threshold's scale (cgmia's module doc)
            runs.append(binary_metrics(y, score, (score >= det.threshold["value"]).astype(np.int8), n_bootstrap=0))
        on = [b for b, m in zip(C.EXPERT_BLOCKS, mask) if m]
        out.append({"blocks": on, "label": "+".join(on) if on else "none (semantic only)",
                    "without_pass_only": list(mask) == [True, True, True, False],
                    "median": median_over_repeats(runs)})
    return out


def scores_to_dict(result: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-friendly part of an ``evaluate_detectors`` result (drops the scores table)."""
    return {k: v for k, v in result.items() if k != "scores"}
