"""Building a detector card from a shadow collection: fit every detector on one half of
the shadow's tasks, then measure, calibrate and set cuts on the other half, which no
detector trained or chose a threshold on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.detect.card import DETECTORS_DIR, FIT_SCORES, DetectorCard, write_card
from leakray.evaluate.calibration import calibration_report, fit_calibrator
from leakray.evaluate.thresholds import choose_threshold
from leakray.parts import PartClock
from leakray.schema import C, S

SHADOW_TASKS = "shadow_tasks.parquet"


def stratified_half(table: pa.Table, share: float, seed: int, groups: list[list[str]] = ()
                    ) -> tuple[pa.Table, pa.Table]:
    """(fit, validation) rows of a shadow collection (one row a task), stratified by membership,
    each of ``groups`` (near-copies) on one side: a learned detector validated on a copy of one of its
    own training tasks would be validated on its training text (`data.folds.keep_together`)."""
    from sklearn.model_selection import train_test_split

    from leakray.data.folds import keep_together

    idx = np.arange(table.num_rows)
    y = table.column(C.MEMBER).to_numpy()
    fit, val = train_test_split(idx, test_size=share, stratify=y, random_state=seed)
    ids, in_val = table.column(C.TASK_ID).to_pylist(), set(val.tolist())
    length = (dict(zip(ids, map(len, table.column(C.REFERENCE).to_pylist())))
              if C.REFERENCE in table.column_names else None)
    side, _ = keep_together({t: int(i in in_val) for i, t in enumerate(ids)}, groups, length,
                            stratum=dict(zip(ids, y.tolist())))
    val_mask = np.array([side[t] for t in ids], bool)
    return table.filter(pa.array(~val_mask)), table.filter(pa.array(val_mask))


def build_card(shadow: pa.Table, cfg, out: Path, *, storage: Path, meta: dict,
               groups: list[list[str]] = (), tally=None) -> DetectorCard:
    from leakray.evaluate.inflation import pass_at_1
    from leakray.protocols.detectors import detect_parts, evaluate_detectors
    from leakray.protocols.simulate import learned_detectors

    a, d = cfg.audit, cfg.detect
    fit, val = stratified_half(shadow, a.validation_share, a.shadow_seed, groups)
    detectors = learned_detectors(cfg)
    if detectors == "all":  # an audit's reference model is never the oracle: simulate's second one has no place
        from leakray.detect import registry

        detectors = [n for n in registry.names() if not n.endswith("_nonoracle")]
    result = evaluate_detectors(fit, val, d.cgmia_config(), d.seeds, use_ray_train=d.ray_train(),
                                storage_path=storage, save_dir=out / DETECTORS_DIR, threshold_rule=d.threshold_rule,
                                bootstrap=d.bootstrap, detectors=detectors, detector_params=d.params,
                                trace_memory=d.trace_memory, parallel=d.parallel, copy_groups=groups, tally=tally)
    clock = PartClock()
    clock.merge(result.pop("part_seconds", None))
    clock.switch("calibrate")  # each detector's calibration, its quality and its cut
    scores = result["scores"].to_pandas()
    calibration, quality, cuts = {}, {}, {}
    for name in result["median"]:
        seed = d.seeds[0] if result["specs"][name]["learns"] else scores[scores[S.DETECTOR] == name][S.SEED].iloc[0]
        rows = scores[(scores[S.DETECTOR] == name) & (scores[S.SEED] == seed)]
        y, s = rows[S.MEMBER].to_numpy(np.int64), rows[S.SCORE].to_numpy(np.float64)
        calibration[name] = fit_calibrator(y, s, a.calibration).to_dict()
        quality[name] = calibration_report(y, s, a.calibration, seed=a.shadow_seed)
        th = choose_threshold(y, s, f"shadow_fpr:{a.fpr}", chosen_on="shadow validation rows")
        cuts[name] = {"cut": th.value, "fpr": th.fpr, "tpr": th.tpr, "target_fpr": a.fpr}
    clock.stop()
    # a leak-free model's pass@1 per task (the shadow on the tasks it never saw): the inflation's null
    pq.write_table(pa.table({S.TASK_ID: shadow.column(C.TASK_ID), S.MEMBER: shadow.column(C.MEMBER),
                             "pass1": pa.array(pass_at_1(shadow))}), out / SHADOW_TASKS)
    pq.write_table(fit_half_scores(fit, result["specs"], d.params), out / FIT_SCORES)
    meta = {**meta, "fit_task_ids": sorted(fit.column(C.TASK_ID).to_pylist())}
    card = write_card(out, result=result, val_table=val, calibration=calibration, calibration_quality=quality,
                      suspect_cuts=cuts, meta=meta)
    card.stage_parts = detect_parts(clock, result)  # for the card stage's marker; not written into the card
    return card


def fit_half_scores(fit: pa.Table, specs: dict[str, dict], params: dict | None = None) -> pa.Table:
    """The detectors that learn nothing, scored on the fit half (their scores there are as
    untouched as on the validation half): more shadow rows for the card route's distributions."""
    from leakray.detect import registry
    from leakray.detect.base import missing_input

    rows = {S.DETECTOR: [], S.TASK_ID: [], S.MEMBER: [], S.SCORE: []}
    ids, member = fit.column(C.TASK_ID).to_pylist(), fit.column(C.MEMBER).to_pylist()
    for name, spec in specs.items():
        if spec["learns"] or missing_input(fit, registry.spec(name).columns):
            continue
        score = np.asarray(registry.make(name, (params or {}).get(name)).score(fit), np.float64)
        rows[S.DETECTOR] += [name] * len(ids)
        rows[S.TASK_ID] += ids
        rows[S.MEMBER] += member
        rows[S.SCORE] += score.tolist()
    return pa.table({S.DETECTOR: pa.array(rows[S.DETECTOR], pa.string()), S.TASK_ID: pa.array(rows[S.TASK_ID], pa.string()),
                     S.MEMBER: pa.array(rows[S.MEMBER], pa.int8()), S.SCORE: pa.array(rows[S.SCORE], pa.float64())})
