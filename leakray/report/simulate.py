"""report.json and report.md of a simulated-leakage run: every number, config, seed,
stage timing and model size in JSON; the same, readable, in Markdown.

Besides the detectors' medians the report states how their decisions were made (the
threshold rule and the shadow-chosen cuts), how many seeds were degenerate (MCC 0), how
many non-members the low-FPR numbers rest on, the bootstrap intervals, per-stage stats
from the stage markers, and the sandbox isolation the generated code ran under."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.models.host import fingerprint_line, host_fingerprint
from leakray.report.advprompt_kinds import advprompt_kinds_line
from leakray.report.costs import parts_text, shared_run_note, throughput_text
from leakray.report.rows import resumed_line, row_retries_line
from leakray.runs import MARKER, write_json_atomic
from leakray.schema import C

METRIC_KEYS = ("precision", "recall", "mcc", "auc", "tpr_at_1fpr", "tpr_at_5fpr")
# beside the metrics: the intervals, what the low-FPR numbers rest on, degenerate seeds
DETAIL_KEYS = ("auc_ci", "tpr_at_5fpr_ci", "n_pos", "n_neg", "min_nonzero_fpr", "n_degenerate", "n_repeats")
# per-stage stats the stages write into their markers (missing ones show as –)
# machine_busy: the share of this machine's CPU time that was busy during the stage (`runs.machine_use`)
STAGE_KEYS = ("seconds", "machine_busy", "rows_in", "rows_out", "errors", "parse_failures")
COLLECT_STAGES = ("collect_shadow", "collect_target")


def _mean(values) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return round(float(np.mean(values)), 4) if values else float("nan")


def _stage_cell(key: str, value) -> str:
    if isinstance(value, (int, float)) and key in ("seconds", "machine_busy"):
        return f"{value:.1f}" if key == "seconds" else f"{value:.0%}"
    return _fmt(value)


def leak_summary(table: pa.Table) -> dict:
    """Members vs non-members on one collection: the size of the simulated leak."""
    rows = table.select([C.MEMBER, C.PASSED, C.EDIT_DISTANCE, C.CODEBLEU, C.PERPLEXITY, C.REF_LOSS,
                         C.HAS_TESTS]).to_pylist()
    out = {}
    for label, name in ((1, "members"), (0, "non_members")):
        group = [r for r in rows if r[C.MEMBER] == label]
        tested = [r for r in group if r[C.HAS_TESTS]]
        out[name] = {
            "tasks": len(group),
            "pass_rate": _mean([np.mean(r[C.PASSED]) for r in tested]) if tested else None,
            "tasks_with_a_pass": sum(any(r[C.PASSED]) for r in tested),
            "edit_distance": _mean([np.mean(r[C.EDIT_DISTANCE]) for r in group]),
            "min_edit_distance": _mean([np.min(r[C.EDIT_DISTANCE]) for r in group]),
            "codebleu": _mean([np.mean(r[C.CODEBLEU]) for r in group]),
            "perplexity": _mean([np.mean(r[C.PERPLEXITY]) for r in group]),
            "ref_loss": _mean([r[C.REF_LOSS] for r in group]),
        }
    m, n = out["members"], out["non_members"]
    if m["pass_rate"] is not None:
        # graded: members clearly ahead on pass and similarity, yet not all memorised verbatim
        out["graded"] = bool(m["pass_rate"] > n["pass_rate"] and m["pass_rate"] < 0.9
                             and m["min_edit_distance"] < n["min_edit_distance"]
                             and m["min_edit_distance"] > 0.02)
    return out


def _stage_info(run_dir: Path) -> dict:
    info = {}
    for marker in sorted(run_dir.glob(f"*/{MARKER}")):
        info[marker.parent.name] = json.loads(marker.read_text())
    return info


def detector_summary(metrics: dict) -> dict:
    """Per detector: the median metrics, their details, and the threshold that made its decisions."""
    out = {}
    for name, m in metrics["median"].items():
        row = {k: m.get(k) for k in METRIC_KEYS + DETAIL_KEYS}
        for k in ("n_pos", "n_neg", "n_repeats", "n_degenerate"):  # counts: medians of ints stay ints
            if isinstance(row[k], float) and row[k].is_integer():
                row[k] = int(row[k])
        th = metrics.get("thresholds", {}).get(name)
        # a family evaluated by its own code (advprompt: both settings at once) has its wall time only
        seconds = metrics.get("seconds", {}).get(name)
        row["cost"] = metrics.get("costs", {}).get(name) or (None if seconds is None else {"wall_s": seconds})
        spec = metrics.get("specs", {}).get(name) or {}
        row["access"], row["family"] = spec.get("access"), spec.get("family")
        row["threshold"] = None if th is None else {
            "rule": th["rule"], "chosen_on": th["chosen_on"], "values": th["values"],
            "median": float(np.median(th["values"])) if th["values"] else None}
        out[name] = row
    return out


def stage_stats(stages: dict) -> dict:
    """``{stage: {seconds, machine_busy, rows_in, rows_out, errors, parse_failures}}`` from the
    markers (None if absent: a marker written before machine_cpu was recorded, or not on Linux)."""
    return {name: {**{k: info.get(k) for k in STAGE_KEYS},
                   "machine_busy": (info.get("machine_cpu") or {}).get("busy_share"),
                   # each part's seconds and the stage's throughput (`leakray.parts`), where it timed them
                   **{k: info[k] for k in ("part_seconds", "throughput") if info.get(k)},
                   # a collection's rows tried again after a failure another attempt can cure, where any
                   **({"row_retries": info["row_retries"]} if info.get("row_retries") else {}),
                   # and the rows it read back from a killed attempt of itself
                   **({"resumed_rows": info["resumed_rows"]} if info.get("resumed_rows") else {}),
                   # adopted from another run made from the same inputs (runs.adopt): its numbers are that run's
                   **({"reused_from": info["reused_from"]} if info.get("reused_from") else {})}
            for name, info in stages.items()}


def isolation_of(stages: dict) -> dict:
    """The sandbox isolation level each collect stage recorded (None where it recorded none)."""
    return {name: stages[name].get("isolation") for name in COLLECT_STAGES if name in stages}


def reference_models(collect_target: dict, metrics: dict) -> dict | None:
    """The calibrated attack against both references, side by side: the oracle (the target's own
    pre-leak checkpoint, which a real audit never has) and one an auditor could have."""
    oracle, other = collect_target.get("reference_model"), collect_target.get("nonoracle_reference")
    if not oracle:
        return None
    auc = {n: (metrics.get("median", {}).get(n) or {}).get("auc") for n in ("ref_calibrated", "ref_calibrated_nonoracle")}
    return {"oracle": oracle, "nonoracle": other, "auc": auc}


def straddling_copies(table: pa.Table) -> list[list]:
    """Pairs of a collection's tasks whose solutions nearly copy each other (`screen.siblings`) with
    one a member and the other not: one text on both sides of the split, so the non-member was read
    in substance and the detectors' AUC counts it as unseen. [member id, non-member id, Jaccard]."""
    from leakray.data.tasks import continuation
    from leakray.screen.siblings import near_copies

    if not {C.TASK_ID, C.MEMBER, C.PROMPT, C.REFERENCE} <= set(table.column_names):
        return []  # a collection without the texts (a test's minimal table): nothing to compare
    ids, member = table.column(C.TASK_ID).to_pylist(), table.column(C.MEMBER).to_pylist()
    texts = [continuation(p, r) for p, r in zip(table.column(C.PROMPT).to_pylist(),
                                                table.column(C.REFERENCE).to_pylist())]
    is_member = dict(zip(ids, member))
    return [[a, b, j] if is_member[a] == 1 else [b, a, j]
            for a, b, j in near_copies(ids, texts) if {is_member[a], is_member[b]} == {0, 1}]


def straddling_line(r: dict) -> list[str]:
    """The report's warning when a near-copy pair sits on both sides of a model's split."""
    from leakray.screen.siblings import SIBLINGS

    found = {role: pairs for role, pairs in (r.get("near_copies_across_split") or {}).items() if pairs}
    if not found:
        return []
    words = "; ".join(f"{role}: " + ", ".join(f"member {m} ~ non-member {n} ({j:.2f})" for m, n, j in pairs)
                      for role, pairs in sorted(found.items()))
    return ["", f"Near-copies across the split (solutions at Jaccard ≥ {SIBLINGS.threshold} of {SIBLINGS.ngram}-token "
                "shingles, screen/siblings.py): the non-member of each pair was read in substance, and the detectors' "
                f"rates count it as unseen — {words}."]


def write_report(run_dir: Path, cfg: dict, timings: dict) -> dict:
    stages = _stage_info(run_dir)
    metrics = json.loads((run_dir / "detect" / "metrics.json").read_text())
    target = pq.read_table(run_dir / "collect_target" / "collection.parquet")
    shadow = pq.read_table(run_dir / "collect_shadow" / "collection.parquet")
    base = stages.get("base", {}).get("stats", {})
    report = {
        "run": run_dir.name,
        "benchmark": cfg["benchmark"],
        "protocol": "CGMIA simulated leakage (RQ1): target = base + D1, shadow = base + D3; "
                    "detectors trained on shadow (D3 members, D4 non-members), tested on target "
                    "(D1 members, D2 non-members)",
        "isolation": isolation_of(stages),
        "threshold_rule": metrics.get("threshold_rule"),
        "bootstrap": metrics.get("bootstrap"),
        "detectors": detector_summary(metrics),
        "detectors_full": metrics,
        "skipped": metrics.get("skipped", {}),
        "reference_models": reference_models(stages.get("collect_target", {}), metrics),
        "leak": {"target": leak_summary(target), "shadow": leak_summary(shadow)},
        "near_copies_across_split": {"target": straddling_copies(target), "shadow": straddling_copies(shadow)},
        "stages": stage_stats(stages),
        "timings_s": {**{name: info.get("seconds") for name, info in stages.items()},
                      "sum_of_stages": round(sum(i.get("seconds", 0) for i in stages.values()), 1), **timings},
        "models": {
            "base": {"path": stages.get("base", {}).get("path"), "parameters": base.get("parameters"),
                     "pretrain_steps": base.get("steps"), "val_loss": base.get("val_loss"),
                     "cached": base.get("cached")},
            **{role: {k: stages.get(role, {}).get(k) for k in
                      ("parameters", "trainable_parameters", "steps", "final_loss", "loss_per_epoch", "n_texts",
                       "host", "device", "trained_dtype", "saved_dtype")}
               for role in ("target", "shadow")},
        },
        "collections": {role: {k: v for k, v in stages.get(f"collect_{role}", {}).items() if k != "stage"}
                        for role in ("shadow", "target")},
        "seeds": {"folds": cfg["benchmark"].get("fold_seed"), "target": cfg["target"].get("seed"),
                  "shadow": cfg["shadow"].get("seed"), "sample": cfg["sample"].get("seed"),
                  "detector": cfg.get("detect", {}).get("seeds")},
        "config": cfg,
        # the driver's host; each fine-tune's marker carries the host that trained it (`host`)
        "environment": host_fingerprint(),
    }
    write_json_atomic(run_dir / "report.json", report)
    (run_dir / "report.md").write_text(render_markdown(report))
    try:  # the HTML is a view of report.json: a failure costs the view, never the run
        from leakray.report.html import write_simulate_html
        write_simulate_html(run_dir)
    except Exception as exc:  # noqa: BLE001
        logging.getLogger(__name__).warning("report.html not written: %s: %s", type(exc).__name__, exc)
    return report


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {n}" for k, n in sorted(v.items())) if v else "0"
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return f"[{_fmt(v[0])}, {_fmt(v[1])}]"
    return str(v)


def _isolation_line(iso: dict) -> str:
    if not iso:
        return "Sandbox isolation of generated code: not recorded (no collect stage marker)."
    levels = {v for v in iso.values()}
    if len(levels) == 1:
        (level,) = levels
        return f"Sandbox isolation of generated code: **{_fmt(level)}** ({', '.join(iso)})."
    return "Sandbox isolation of generated code: " + "; ".join(f"{k}: **{_fmt(v)}**" for k, v in iso.items()) + "."


def _threshold_lines(r: dict) -> list[str]:
    rule = r.get("threshold_rule")
    lines = [f"Decision thresholds: rule `{rule or '–'}`, chosen on the shadow collection and applied "
             "unchanged to the target (precision, recall and MCC use them; AUC and TPR@FPR are threshold-free)."]
    for name, m in r["detectors"].items():
        th = m.get("threshold")
        if th:
            vals = th["values"]
            shown = _fmt(vals[0]) if len(vals) == 1 else f"median {_fmt(th['median'])} " \
                f"(range {_fmt(min(vals))}–{_fmt(max(vals))} over {len(vals)} seeds)"
            lines.append(f"- {name}: {shown}, chosen on {th['chosen_on']}")
    return lines


def _low_fpr_note(r: dict) -> str:
    negs = {m.get("n_neg") for m in r["detectors"].values() if m.get("n_neg")}
    boot = r.get("bootstrap") or {}
    note = ("TPR@FPR is the conservative step (the largest TPR at a cut whose FPR does not exceed the target, "
            "no interpolation).")
    if len(negs) == 1:
        (n,) = negs
        note += (f" The target has {n} non-members, so the smallest nonzero FPR is 1/{n} = {1 / n:.3f}"
                 + (": TPR@1%FPR counts only cuts with no false positive." if 1 / n > 0.01 else "."))
    if boot:
        note += (f" Intervals: 95% percentile bootstrap, {boot.get('n_resamples')} resamples of the target "
                 f"stratified by class, seed {boot.get('seed')}"
                 + (f", each of the target's {boot['groups_drawn_whole']} near-copy group(s) drawn as one task"
                    if boot.get("groups_drawn_whole") else "")
                 + "; over several seeds the median of the per-seed bounds.")
    return note


DETECTOR_COLUMNS = (("precision", "precision"), ("recall", "recall"), ("mcc", "MCC"), ("auc", "AUC"),
                    ("auc_ci", "AUC 95% CI"), ("tpr_at_1fpr", "TPR@1%FPR"), ("tpr_at_5fpr", "TPR@5%FPR"),
                    ("tpr_at_5fpr_ci", "TPR@5%FPR 95% CI"), ("n_neg", "non-members"),
                    ("n_degenerate", "degenerate seeds"))


COST_COLUMNS = ("access", "wall s", "peak RSS MB")


def _wall_cell(cost: dict) -> str:
    """A detector's wall seconds; a run shared by several detectors is said so (`costs.shared_run_note`)."""
    note = shared_run_note(cost, _fmt)
    return _fmt(cost.get("wall_s")) + (f" {note}" if note else "")


def _by_auc(item) -> tuple:
    """Highest AUC first; a NaN or missing AUC last; ties by name."""
    auc = item[1].get("auc")
    ok = isinstance(auc, (int, float)) and not math.isnan(auc)
    return (not ok, -auc if ok else 0.0, item[0])


def _ablation_lines(metrics: dict) -> list[str]:
    """AdvPrompt's RQ2 (without each kind / feature) and CGMIA's expert-block subsets, when run."""
    lines = []
    ab = metrics.get("advprompt_ablation")
    if ab:
        lines += ["", f"## AdvPrompt ablation (shadow setting, seed {ab['seed']}; target AUC, all inputs "
                      f"{_fmt(ab['all'])})", "", "| without kind | AUC |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in ab["without_kind"].items()]
        lines += [f"| {k} | not collected (columns.advprompt_kinds) |" for k in ab.get("not_collected", [])]
        worst = sorted(ab["without_feature"].items(), key=lambda kv: kv[1])[:5]
        lines += ["", "Features whose removal costs the most AUC: "
                  + ", ".join(f"{k} ({_fmt(v)})" for k, v in worst) + "."]
    ex = metrics.get("expert_ablation")
    if ex:
        lines += ["", "## CGMIA expert-block ablation", "", "```json", json.dumps(ex, indent=1)[:4000], "```"]
    return lines


def render_markdown(r: dict) -> str:
    lines = [f"# leakray simulated-leakage audit — {r['benchmark']['name']}", "", r["protocol"] + ".", "",
             _isolation_line(r.get("isolation") or {}), *straddling_line(r), "",
             *([fingerprint_line(r["environment"]), ""] if (r.get("environment") or {}).get("cpu") else []),
             "## Detectors on the target (median over seeds)", "",
             "| detector | " + " | ".join(h for _, h in DETECTOR_COLUMNS) + " | " + " | ".join(COST_COLUMNS) + " |",
             "|---" * (len(DETECTOR_COLUMNS) + len(COST_COLUMNS) + 1) + "|"]
    for name, m in sorted(r["detectors"].items(), key=_by_auc):
        cells = []
        for key, _ in DETECTOR_COLUMNS:
            v = m.get(key)
            if key == "n_degenerate" and v is not None and m.get("n_repeats") is not None:
                v = f"{v} of {m['n_repeats']}"
            cells.append(_fmt(v))
        cost = m.get("cost") or {}
        peak = _fmt(cost.get("peak_rss_mb"))
        if cost.get("peak_rss_how") == "sampled" and cost.get("peak_rss_mb") is not None:
            peak = "≥ " + peak  # a sampler can miss a shorter peak: what it saw is a lower bound
        cells += [_fmt(m.get("access")), _wall_cell(cost), peak]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Sorted by AUC. Wall time covers fit, threshold and scoring over all seeds; "
              + ((r.get("detectors_full") or {}).get("cost_note") or "")]
    if any(shared_run_note(m.get("cost") or {}, _fmt) for m in r["detectors"].values()):
        lines += ["", "\"shared by n\": one run fitted n detectors (the classic models' Tune search, CGMIA with "
                  "its ensemble); the run's wall time is shown for each of them and includes waiting for a CPU beside "
                  "the other detectors' tasks; \"own trials\": the seconds that detector's own Tune trials spent "
                  "fitting."]
    lines += [f"- **{name}** skipped: {why}" for name, why in (r.get("skipped") or {}).items()]
    lines += advprompt_kinds_line(r.get("config"), r.get("detectors", {}))
    refs = r.get("reference_models")
    if refs:
        auc = refs["auc"]
        lines += ["", f"Reference models: `ref_calibrated` calibrates against the oracle, the target's own "
                      f"pre-leak checkpoint (`{refs['oracle']}`; AUC {_fmt(auc.get('ref_calibrated'))}), which a "
                      "real audit never has; "
                  + (f"`ref_calibrated_nonoracle` against `{refs['nonoracle']}` (AUC "
                     f"{_fmt(auc.get('ref_calibrated_nonoracle'))}), a reference an auditor could have."
                     if refs.get("nonoracle") else "no non-oracle reference was scored: set "
                     "columns.nonoracle_reference=auto (the other local architecture) or a model to compare.")]
    lines += ["", *_threshold_lines(r), "", _low_fpr_note(r),
              "A seed is degenerate when its decisions put every target row in one class (a confusion-matrix "
              "margin is empty); its MCC counts as 0 in the median."]
    lines += _ablation_lines(r.get("detectors_full") or {})
    lines += ["", "## The simulated leak (members vs non-members)", ""]
    for role in ("target", "shadow"):
        leak = r["leak"][role]
        verdict = ""
        if "graded" in leak:
            verdict = (" — graded leak: **yes**" if leak["graded"] else " — graded leak: **no**") + (
                " (graded = members' pass rate above non-members' yet below 0.9, and members' closest "
                "sample nearer the reference than non-members' yet not a verbatim copy)")
        lines += [f"**{role}**{verdict}", "",
                  "| group | tasks | pass rate | tasks with a pass | mean edit dist. | min edit dist. | "
                  "CodeBLEU | perplexity | ref. loss |", "|---" * 9 + "|"]
        for group in ("members", "non_members"):
            g = leak[group]
            lines.append(f"| {group} | " + " | ".join(_fmt(g[k]) for k in (
                "tasks", "pass_rate", "tasks_with_a_pass", "edit_distance", "min_edit_distance", "codebleu",
                "perplexity", "ref_loss")) + " |")
        lines.append("")
    lines += ["## Stages", "", "| stage | " + " | ".join(k.replace("_", " ") for k in STAGE_KEYS)
              + " | parts (busy s) | throughput |", "|---" * (len(STAGE_KEYS) + 3) + "|"]
    for name, st in (r.get("stages") or {}).items():
        cells = [_stage_cell(k, st.get(k)) for k in STAGE_KEYS] + [parts_text(st) or "–", throughput_text(st) or "–"]
        made_by = f" (made by {st['reused_from']})" if st.get("reused_from") else ""
        lines.append(f"| {name}{made_by} | " + " | ".join(cells) + " |")
    lines += ["", "machine busy: the share of the CPU time of the machine that ran the driver (on a cluster, the "
              "head's node) that was busy during the stage; stages run side by side share it. Near 100% a stage "
              "is bound by its CPUs' work (more CPUs or less work shortens it); idle CPUs mean it waited. "
              "parts: the seconds of each part of the stage, summed over the processes that did it (parts that ran "
              "side by side add up to more than the stage's wall time), slowest first; throughput: per second of "
              "the part that did the work."]
    lines += row_retries_line(r.get("stages") or {}) + resumed_line(r.get("stages") or {})
    if any(st.get("reused_from") for st in (r.get("stages") or {}).values()):
        lines += ["", "made by: the stage was adopted from that run, made from the same inputs (the settings it reads "
                  "are this run's); its numbers are that run's."]
    extra = {k: v for k, v in r["timings_s"].items() if k not in (r.get("stages") or {})}
    if extra:
        lines += ["", "Timings: " + ", ".join(f"{k} {v:.1f} s" if isinstance(v, (int, float)) else f"{k} {_fmt(v)}"
                                          for k, v in extra.items()) + "."]
    lines += ["", "## Models", "", "```json", json.dumps(r["models"], indent=1), "```",
              "", "## Collections", "", "```json", json.dumps(r["collections"], indent=1), "```",
              "", f"Seeds: `{json.dumps(r['seeds'])}`. Full configuration and per-seed metrics: `report.json`.", ""]
    return "\n".join(lines)
