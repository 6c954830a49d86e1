"""An audit's report.md: the leaked fraction and how each route read it, the verdicts, the
inflation and the detectors' table, in sentences a pull-request comment can carry (the numbers
come from `report.audit`'s report.json, none is computed here)."""

from __future__ import annotations

import numpy as np

from leakray.models.host import fingerprint_line
from leakray.report.advprompt_kinds import advprompt_kinds_line
from leakray.report.costs import parts_by_stage, time_by_stage
from leakray.report.rows import row_lines


def copies_of_fit_words(copies: list[str] | None) -> str:
    if not copies:
        return ""
    return (f", none of them a near-copy of a training task ({len(copies)} such left out: "
            f"{', '.join(copies[:5])}{' …' if len(copies) > 5 else ''})")


def chat_words(c: dict | None) -> str:
    if not c:
        return ""
    a = c["answers"]
    return (f" (through its chat API: no `echo`, no one-token draws; rows whose answers were fenced "
            f"{a['chat_answer_fenced']}, opened with a sentence {a['chat_answer_prose_before_code']}, wrote the given "
            f"code out again {a['chat_answer_repeated_the_code']}, of {c['rows']})")


def leak_words(leak: dict | None) -> str:
    leak = leak or {"mode": "finetune"}
    if leak.get("mode") == "pretrain-mix":
        return f"read each member {leak.get('dose')} times in pretraining"
    return "was fine-tuned on its members" + (f" for {leak['epochs']} epochs" if leak.get("epochs") else "")


def near_copies_words(c: dict | None) -> str:
    """The report's sentence on near-copies inside the benchmark ("" when there are none)."""
    if not c or not c.get("pairs"):
        return ""
    pairs, clean = c["pairs"], c["clean_copies_of_flagged"]
    shown = ", ".join(f"{a} ~ {b} ({j:.2f})" for a, b, j in pairs[:5]) + (
        f" and {len(pairs) - 5} more" if len(pairs) > 5 else "")
    kept = ""
    if clean:
        one = len(clean) == 1
        where = ("is removed from the cleaned file with it" if one else "are removed from the cleaned file with them") \
            if c.get("dropped") else (f"{'stays' if one else 'stay'} in the cleaned file "
                                      "(`audit.cleaned_near_copies=keep`)")
        kept = (f"; {len(clean)} clean {'task is a near-copy' if one else 'tasks are near-copies'} of a flagged one "
                f"and {where}: {', '.join(clean)}")
    return (f" Near-copies inside the benchmark (solutions at Jaccard ≥ {c['threshold']} of their "
            f"{c.get('ngram', 2)}-token shingles): "
            f"{len(pairs)} pair{'' if len(pairs) == 1 else 's'}: {shown}. A model that saw one task of a pair saw the "
            f"other's solution too{kept} (`near_copies` in samples.parquet).")


def fmt(v, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "–"
    return f"{v:.1%}" if pct else f"{v:.3f}"


NET = ", net of each task's difficulty and length"


def render_markdown(r: dict) -> str:
    s = r["summary"]
    lf, i, v = s["leaked_fraction"], s["inflation"], s["verdicts"]
    sc, cr = s.get("self_calibrated") or {}, s.get("card_route") or {}
    if lf["estimate"] is None:
        head = f"**Leaked fraction: not estimated.** {lf['statement'][:1].upper()}{lf['statement'][1:]}"
    else:
        head = (f"**Estimated leaked fraction: {fmt(lf['estimate'], True)}** (95% CI {fmt(lf['ci'][0], True)}–"
                f"{fmt(lf['ci'][1], True)}; {lf['route']} route)"
                + (f"; planted truth {fmt(lf['truth'], True)}" if lf.get("truth") is not None else "")
                + (f". {lf['caveat'][0].upper()}{lf['caveat'][1:]}." if lf.get("caveat") else ""))
    null = i.get("null") or {}
    lines = [
        f"# {r['title']}", "", head, "",
        f"- self-calibrated route ({sc.get('n_tested', 0)} tasks; likelihood ratio to the reference model "
        f"{s.get('reference_model')}{NET if sc.get('adjustment') else ''}, null fitted on the target's own scores"
        f"{drawn_words(sc)}): "
        + (f"{fmt(sc.get('estimate'), True)} ({fmt((sc.get('ci') or [None])[0], True)}–"
           f"{fmt((sc.get('ci') or [None, None])[1], True)})" if sc.get("estimate") is not None else "–")
        + ("" if sc.get("usable") else f" — not used: {sc.get('why_unusable')}"),
        *([control_line(s["control"])] if s.get("control") else []),
        f"- access: {s.get('access', '–')}{chat_words(s.get('chat_api'))} — detectors run: "
        f"{', '.join(s.get('detectors_run') or []) or 'none'}",
        f"- card route ({s['primary_detector']}, rates off the rows that chose its cut; the card's shadow "
        f"{leak_words((s.get('shadow_vs_target') or {}).get('shadow_leak'))}): "
        + (f"{fmt(cr.get('estimate'), True)} ({fmt(cr['ci'][0], True)}–{fmt(cr['ci'][1], True)})"
           if cr.get("estimate") is not None else "–")
        + ("" if cr.get("usable") else f" — not used: {cr.get('why_unusable')}"),
        f"- cross-fitting: {', '.join(s['crossfit']['detectors']) or 'no learned detector'} scored only the "
        f"{s['n_tasks'] - s['crossfit']['left_out_tasks']} tasks the card held out from their training"
        + copies_of_fit_words(s["crossfit"].get("copies_of_fit_tasks"))
        + (f"; {s['shadow_vs_target']['note']}" if s['shadow_vs_target'].get("note") else ""), "",
        f"Verdicts over {s['n_tasks']} samples: {v['confirmed']} confirmed (near-duplicate in the corpus), "
        f"{v['suspected']} suspected ({s['suspected_means']}), {v['clean']} clean."
        + near_copies_words(s.get("near_copies")), "",
        f"pass@1: flagged {fmt(i['pass1_flagged'])}, clean {fmt(i['pass1_clean'])}, ratio {fmt(i['ratio'])}"
        + (f" (95% CI {fmt(i['ratio_ci'][0])}–{fmt(i['ratio_ci'][1])})" if i.get("ratio_ci") else "")
        + (f" — {i['why']}" if i.get("why") else "")
        + f". Score on all samples {fmt(i['score_all'])}, on clean samples only {fmt(i['score_clean'])}."
        + (f" A leak-free model (the card's shadow on tasks it never saw) shows a flagged − clean difference of "
           f"{fmt(null['difference'])}; the excess is {fmt(null.get('excess_difference'))}."
           if null.get("difference") is not None else ""), "",
        f"Detector card {s['card']}; calibration {r['calibration']['method']} (Brier {r['calibration']['brier']:.3f} "
        f"vs {r['calibration']['brier_uncalibrated']:.3f} for the base rate). Cleaned benchmark: "
        f"{r['cleaned'].get('path') or r['cleaned'].get('error')} ({r['cleaned']['removed']} removed"
        + (f"; the {r['cleaned']['not_audited']} tasks past benchmark.limit were not audited and are left out"
           if r['cleaned'].get('not_audited') else "") + ").", "",
        "| detector | family | shadow-validation AUC | 95% CI | TPR@5%FPR |" + (" AUC on the target (truth) |" if r.get("truth") else ""),
        "|---|---|---|---|---|" + ("---|" if r.get("truth") else ""),
    ]
    for name, d in sorted(r["detectors"].items(), key=lambda kv: -(kv[1]["auc"] or 0)):
        ci = d.get("auc_ci") or [None, None]
        lines.append(f"| {name} | {d['family']} | {fmt(d['auc'])} | {fmt(ci[0])}–{fmt(ci[1])} | {fmt(d['tpr_at_5fpr'])} |"
                     + (f" {fmt(d.get('target_auc'))} |" if r.get("truth") else ""))
    lines += advprompt_kinds_line(r.get("config"), r["detectors"])
    if r.get("skipped"):
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    lines += row_lines(r.get("stages") or {})
    if (r.get("environment") or {}).get("cpu"):
        lines += ["", fingerprint_line(r["environment"])]
    lines += time_by_stage(r.get("stages") or {}, r.get("timings_s") or {}) + parts_by_stage(r.get("stages") or {})
    lines += ["", "Per-sample verdicts: samples.parquet and report.html."]
    return "\n".join(lines) + "\n"


def control_line(c: dict) -> str:
    test = c.get("test") or {}
    ex = c.get("exchangeability") or {}
    return (f"- control route ({c.get('n_tested', 0)} tasks against {c.get('n_control', 0)} control tasks, conformal "
            f"p-values{drawn_words(c)}): "
            + (f"{fmt(c.get('estimate'), True)} ({fmt(c['ci'][0], True)}–{fmt(c['ci'][1], True)}), at least "
               f"{fmt(c.get('lower_bound'), True)} (one-sided 95%); benchmark > control: Mann–Whitney p "
               f"{test['p']:.2g}" if test and c.get("detected") is not None else "–")
            + (f"; control tasks like the benchmark's (KS p {ex['reference_loglik_per_char']['p']:.2g} on the reference "
               f"model's likelihood, {ex['log_length']['p']:.2g} on length)" if ex.get("ok") else "")
            + ("" if c.get("usable") else f" — not used: {c.get('why_unusable')}")
            + left_out_words(c.get("near_copies_left_out")))


def drawn_words(route: dict) -> str:
    """How a route's bootstrap drew the benchmark, where it is not task by task (`evaluate.resample`)."""
    by = route.get("resampled_by") or "task"
    return "" if by == "task" else f"; its interval's bootstrap drew each {by}"


def left_out_words(copies: list | None) -> str:
    if not copies:
        return ""
    shown = ", ".join(f"{c} ~ {b}" for c, b, _ in copies[:3]) + (" …" if len(copies) > 3 else "")
    return (f"; {len(copies)} control task{'' if len(copies) == 1 else 's'} left out as near-copies of benchmark "
            f"tasks, which the target may have read with them ({shown})")
