"""report.json and report.md of a simulated-leakage run: every number, config, seed,
stage timing and model size in JSON; the same, readable, in Markdown."""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.runs import MARKER, write_json_atomic
from leakray.schema import C

METRIC_KEYS = ("precision", "recall", "mcc", "auc", "tpr_at_1fpr", "tpr_at_5fpr")


def _mean(values) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return round(float(np.mean(values)), 4) if values else float("nan")


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
        "detectors": {name: {k: m.get(k) for k in METRIC_KEYS} for name, m in metrics["median"].items()},
        "detectors_full": metrics,
        "leak": {"target": leak_summary(target), "shadow": leak_summary(shadow)},
        "timings_s": {**{name: info.get("seconds") for name, info in stages.items()},
                      "sum_of_stages": round(sum(i.get("seconds", 0) for i in stages.values()), 1), **timings},
        "models": {
            "base": {"path": stages.get("base", {}).get("path"), "parameters": base.get("parameters"),
                     "pretrain_steps": base.get("steps"), "val_loss": base.get("val_loss"),
                     "cached": base.get("cached")},
            **{role: {k: stages.get(role, {}).get(k) for k in
                      ("parameters", "trainable_parameters", "steps", "final_loss", "loss_per_epoch", "n_texts")}
               for role in ("target", "shadow")},
        },
        "collections": {role: {k: v for k, v in stages.get(f"collect_{role}", {}).items() if k != "stage"}
                        for role in ("shadow", "target")},
        "seeds": {"folds": cfg["benchmark"].get("fold_seed"), "target": cfg["target"].get("seed"),
                  "shadow": cfg["shadow"].get("seed"), "sample": cfg["sample"].get("seed"),
                  "detector": cfg.get("detect", {}).get("seeds")},
        "config": cfg,
        "environment": {"python": platform.python_version(), "machine": platform.machine()},
    }
    write_json_atomic(run_dir / "report.json", report)
    (run_dir / "report.md").write_text(render_markdown(report))
    return report


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def render_markdown(r: dict) -> str:
    lines = [f"# leakray simulated-leakage audit — {r['benchmark']['name']}", "", r["protocol"] + ".", "",
             "## Detectors on the target (median over seeds)", "",
             "| detector | " + " | ".join(METRIC_KEYS) + " |", "|---" * (len(METRIC_KEYS) + 1) + "|"]
    for name, m in r["detectors"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m.get(k)) for k in METRIC_KEYS) + " |")
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
    lines += ["## Stages", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in r["timings_s"].items()]
    lines += ["", "## Models", "", "```json", json.dumps(r["models"], indent=1), "```",
              "", "## Collections", "", "```json", json.dumps(r["collections"], indent=1), "```",
              "", f"Seeds: `{json.dumps(r['seeds'])}`. Full configuration and per-seed metrics: `report.json`.", ""]
    return "\n".join(lines)
