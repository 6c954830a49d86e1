"""The detectability curve: the pretrain-mix leak at each dose, every detector's AUC and
TPR@5%FPR against the dose, and per detector the smallest dose its AUC's 95% interval
clears 0.5 at.

Each dose is one pretrain-mix run under ``dose-sweep-<hash>/`` (resumable on its own; run by
``fanout.fan_out``);
what does not depend on the dose is built once and reused from the cache: the base model,
the screened clean corpus, the AdvPrompt variants' proofs (same tasks, same seed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from leakray.runs import write_json_atomic

METRICS = ("auc", "tpr_at_5fpr")


def dose_children(cfg) -> list:
    """One pretrain-mix run per dose (``fanout.fan_out`` runs them under one parent)."""
    def child(dose: int):
        leak = cfg.leak.model_copy(update={"mode": "pretrain-mix", "dose": dose})
        return lambda output_dir: cfg.model_copy(update={"leak": leak, "output_dir": output_dir})

    return [(f"dose {d}", child(d)) for d in sorted(set(cfg.leak.doses))]


def aggregate(parent: Path, runs: dict[str, Path], console) -> None:
    curve = detectability({int(label.split()[-1]): run for label, run in runs.items()})
    write_json_atomic(parent / "detectability.json", curve)
    (parent / "detectability.md").write_text(render_markdown(curve))
    write_plots(parent, curve)
    console.say(f"detectability curve: {parent}/detectability.md")


def detectability(runs: dict[int, Path]) -> dict:
    """dose -> metric per detector, and the smallest dose whose AUC interval clears 0.5. Dose 0,
    where the sweep has it, is the control (no member inserted): it is never a dose "detected at",
    and a detector whose interval clears 0.5 there (``control_clears``) reads a difference between
    the member and non-member folds' tasks, which its AUC at every dose carries too."""
    reports = {d: json.loads((r / "report.json").read_text()) for d, r in runs.items()}
    doses = sorted(reports)
    names = sorted({n for r in reports.values() for n in r["detectors"]})
    per = {}
    for name in names:
        rows = [reports[d]["detectors"].get(name, {}) for d in doses]
        clears = [d for d, m in zip(doses, rows) if (m.get("auc_ci") or [None])[0] is not None and m["auc_ci"][0] > 0.5]
        per[name] = {
            "family": next((m.get("family") for m in rows if m.get("family")), None),
            **{metric: [_num(m.get(metric)) for m in rows] for metric in METRICS},
            "auc_ci": [m.get("auc_ci") for m in rows],
            "smallest_dose_detected": next((d for d in clears if d > 0), None),
            "control_clears": (0 in clears) if 0 in doses else None,
        }
    share = {d: _marker(runs[d], "target").get("member_token_share") for d in doses}
    return {"doses": doses, "detectors": per, "member_token_share": share,
            "runs": {d: str(runs[d]) for d in doses}}


def _marker(run: Path, stage: str) -> dict:
    from leakray.runs import MARKER

    path = Path(run) / stage / MARKER
    return json.loads(path.read_text()) if path.exists() else {}


def _num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 4)


def render_markdown(c: dict) -> str:
    from leakray.report.html import detected_at

    doses = c["doses"]
    share = " · ".join(f"dose {d}: {100 * (c['member_token_share'].get(d) or 0):.2f}% of tokens" for d in doses)
    lines = ["# Detectability curve (pretrain-mix leak)", "",
             f"Members inserted d times into continued pretraining on a clean corpus; {share}.", "",
             "AUC of each detector on the target (members vs non-members) by dose; *detected at* is the smallest "
             "dose whose AUC 95% interval lies above 0.5. Generation-only detectors see only what the model "
             "writes: expect them to rise late, after the likelihood family."
             + (" Dose 0 is the control: no member was inserted, so an interval above 0.5 there reads a "
                "difference between the member and non-member folds' tasks, not a leak (marked *reads the "
                "folds*)." if 0 in doses else ""), "",
             "| detector | family | " + " | ".join(f"AUC d={d}" for d in doses) + " | TPR@5%FPR at the largest dose "
             "| detected at |", "|---|---|" + "---|" * len(doses) + "---|---|"]
    order = sorted(c["detectors"].items(), key=lambda kv: -((kv[1]["auc"][-1]) or 0))
    for name, m in order:
        aucs = " | ".join("–" if a is None else f"{a:.3f}" for a in m["auc"])
        tpr = m["tpr_at_5fpr"][-1]
        lines.append(f"| {name} | {m['family'] or '–'} | {aucs} | {'–' if tpr is None else f'{tpr:.3f}'} | "
                     f"{detected_at(m, em='*')} |")
    lines += ["", "![AUC by dose](detectability_auc.svg)", ""]
    return "\n".join(lines)


def write_plots(parent: Path, c: dict) -> None:
    import logging

    try:
        from leakray.report.html import render_detectability
        from leakray.report.plots import line_plot

        for metric, label in (("auc", "AUC (target)"), ("tpr_at_5fpr", "TPR at 5% FPR")):
            svg = line_plot(c["doses"], {n: m[metric] for n, m in c["detectors"].items()}, "dose (copies of each "
                            "member)", label, logx=True, title=f"{label} by dose")
            (parent / f"detectability_{metric}.svg").write_text(svg)
        (parent / "detectability.html").write_text(render_detectability(c), encoding="utf-8")
    except Exception as exc:  # the numbers are written; a plotting problem must not lose them
        logging.getLogger(__name__).warning("detectability plots not written: %s", exc)
