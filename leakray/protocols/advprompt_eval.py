"""AdvPrompt-MIA's second setting, on the same footing as every other detector: seeds,
thresholds chosen without the scored rows' labels, the same metrics.

- `advprompt` (shadow setting) is a registry detector (`detect.advprompt_mia`): trained on the
  shadow collection like CGMIA, threshold from out-of-fold shadow log-odds.
- `advprompt_graybox` (the paper's setting): the auditor knows ~20% of the target's members
  and as many non-members; trained (and thresholded, out-of-fold) on those, scored on the
  rest of the target, balanced. Its metrics cover that subset only (n is in the report)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect import advprompt as ap
from leakray.errors import BadInput
from leakray.evaluate.metrics import binary_metrics, median_over_repeats
from leakray.evaluate.thresholds import apply_threshold, choose_threshold


def _fit_thresholded(arrays, seed: int, rule: str, where: str, config):
    det = ap.fit(arrays, config, seed)
    oof = ap.cross_fit_log_odds(arrays, config, seed)
    return det, choose_threshold(arrays["member"], oof, rule, chosen_on=where).to_dict()


def evaluate_advprompt(shadow: pa.Table, target: pa.Table, seeds, *, threshold_rule: str, bootstrap: int,
                       bootstrap_seed: int = 0, config: ap.AdvPromptConfig | None = None,
                       known_fraction: float = 0.2, copy_groups=()) -> dict:
    """{"per_seed": {name: [metrics...]}, "median": {...}, "thresholds": {...}} for the gray-box
    setting (the shadow setting is the registry's ``advprompt``, run with every other detector).
    ``shadow`` is unused here and kept so both settings read the same inputs. ``copy_groups``: the
    benchmark's near-copy groups (lists of task ids): a group's target rows are known together or
    scored together, and its known rows fall in one cross-fitting fold (`graybox_split`)."""
    from leakray.detect.base import keyed_by_copies

    ta = ap.arrays_from_table(keyed_by_copies(target, [list(g) for g in copy_groups]))
    boot = {"n_bootstrap": int(bootstrap), "bootstrap_seed": int(bootstrap_seed)}
    per_seed: dict[str, list] = {"advprompt_graybox": []}
    thresholds: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    for seed in seeds:
        try:
            train, test = ap.graybox_split(ta["member"], known_fraction, seed, groups=ta["task_id"])
            det, th = _fit_thresholded(ap.take(ta, train), seed, threshold_rule,
                                       f"known {known_fraction:.0%} of target members + as many non-members, "
                                       "out-of-fold", config)
        except BadInput as exc:  # a small target leaves too few known rows: the setting is skipped
            skipped["advprompt_graybox"] = f"input unusable: {exc}"
            per_seed.pop("advprompt_graybox", None)
            break
        held = ap.take(ta, test)
        score = det.predict_log_odds(held)
        per_seed["advprompt_graybox"].append({**binary_metrics(held["member"], score,
                                                               apply_threshold(score, th["value"]), **boot,
                                                               # a near-copy group's key (`keyed_by_copies`): drawn whole
                                                               groups=np.asarray(held["task_id"]).astype(str)),
                                              "threshold": th})
        thresholds.setdefault("advprompt_graybox", {"rule": threshold_rule, "chosen_on": th["chosen_on"],
                                                    "values": []})
        thresholds["advprompt_graybox"]["values"].append(th["value"])
    return {"per_seed": per_seed, "median": {k: median_over_repeats(v) for k, v in per_seed.items() if v},
            "thresholds": thresholds, "skipped": skipped}


def kept_variant_share(table: pa.Table) -> float:
    """Share of the 11 variant slots that were present (applicable and proven)."""
    from leakray.schema import C

    kinds = np.asarray(table.column(C.ADV_KIND).to_pylist(), dtype=object)[:, 1:]
    return float((kinds != "").mean())


def advprompt_ablation(shadow: pa.Table, target: pa.Table, seed: int = 0, *,
                       config: ap.AdvPromptConfig | None = None) -> dict:
    """Paper RQ2 in the shadow setting: target AUC with all inputs, then without one
    perturbation kind at a time (its slots masked as missing), then without one feature."""
    from dataclasses import replace

    from sklearn.metrics import roc_auc_score

    from leakray.perturb.core import KINDS, SLOTS, slot_name

    config = config or ap.AdvPromptConfig()
    sa, ta = ap.arrays_from_table(shadow), ap.arrays_from_table(target)

    def auc(train, test, cfg) -> float:
        return round(float(roc_auc_score(test["member"], ap.fit(train, cfg, seed).predict_log_odds(test))), 4)

    def without_kind(arrays, kind):
        keep = np.array([k != kind for k, _ in SLOTS])
        return {**arrays, "adv_mask": arrays["adv_mask"] & keep}

    # a kind with no variant in either collection (not in columns.advprompt_kinds) is masked
    # already: without it is "all" again, and so is without one of its slots' features
    present = sa["adv_mask"].any(0) | ta["adv_mask"].any(0)
    absent = [kind for kind in KINDS if not any(p for (k, _), p in zip(SLOTS, present) if k == kind)]
    absent_features = {f"{f}_{slot_name(k, i)}" for k, i in SLOTS if k in absent for f in ("sim", "ppl")}
    out = {"seed": seed, "all": auc(sa, ta, config), "without_kind": {}, "without_feature": {},
           "not_collected": absent}
    for kind in KINDS:
        if kind not in absent:
            out["without_kind"][kind] = auc(without_kind(sa, kind), without_kind(ta, kind), config)
    for name in ap.FEATURE_NAMES:
        if name not in absent_features:
            out["without_feature"][name] = auc(sa, ta, replace(config, drop_features=(name,)))
    return out


def advprompt_part(part: str, shadow: pa.Table, target: pa.Table, seeds, threshold_rule: str,
                   bootstrap: int, copy_groups=()) -> dict:
    """One AdvPrompt evaluation of the detect stage beside the registry's detectors ("graybox":
    ``evaluate_advprompt``; "ablation": ``advprompt_ablation`` at the first seed), timed where it
    runs, so the stage can run it as a Ray task beside the others: {"result" | "skipped", "seconds"}.
    ``copy_groups``: the benchmark's near-copy groups, for the gray-box setting's split."""
    import time

    t0 = time.perf_counter()
    try:
        if part == "graybox":
            out = evaluate_advprompt(shadow, target, seeds, threshold_rule=threshold_rule, bootstrap=bootstrap,
                                     copy_groups=copy_groups)
        elif part == "ablation":
            out = advprompt_ablation(shadow, target, list(seeds)[0])
        else:
            raise ValueError(f"unknown AdvPrompt part {part!r}")
    except BadInput as exc:  # an unusable input skips it with the reason (never a 0.5)
        return {"skipped": f"input unusable: {exc}", "seconds": round(time.perf_counter() - t0, 2)}
    return {"result": out, "seconds": round(time.perf_counter() - t0, 2)}

