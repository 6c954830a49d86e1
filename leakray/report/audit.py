"""An audit's verdicts and report: per sample a calibrated membership probability and one
verdict, per benchmark the leaked fraction with its interval, the score inflation, the
cleaned benchmark; report.json (every number), report.md (a pull-request comment),
report.html (plots and the per-sample table), samples.parquet, scores.parquet."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.detect.card import DetectorCard
from leakray.evaluate.inflation import inflation
from leakray.evaluate.prevalence import estimate_prevalence
from leakray.runs import MARKER, write_json_atomic
from leakray.schema import C, P, T

log = logging.getLogger(__name__)
VERDICTS = ("confirmed", "suspected", "clean")
CURVE_POINTS = 200


def choose_primary(card: DetectorCard, usable: list[str], requested: str | None) -> str:
    """The detector behind probabilities and verdicts: the one asked for, else the best
    shadow-validation AUC among those the target's collection can feed (ties: by name)."""
    from leakray.errors import BadInput

    if requested:
        if requested not in usable:
            raise BadInput(f"audit.detector {requested!r} cannot score this target (usable: {', '.join(usable)})",
                           field="audit.detector")
        return requested
    if not usable:
        raise BadInput("no detector of the card can score this target's collection")
    auc = {n: card.meta["detectors"][n]["validation"].get("auc") or 0.0 for n in usable}
    return sorted(usable, key=lambda n: (-auc[n], n))[0]


def screening_evidence(run_dir: Path, name: str) -> dict[str, dict]:
    """task_id -> best pair (corpus id, Jaccard, containment) from the screen stage, if it ran."""
    pairs = run_dir / "screen" / "pairs.parquet"
    if not pairs.exists():
        return {}
    best: dict[str, dict] = {}
    for r in pq.read_table(pairs).to_pylist():
        if r[P.BENCHMARK] != name:
            continue
        cur = best.get(r[P.TASK_ID])
        if cur is None or (r[P.JACCARD], r[P.CONTAINMENT]) > (cur["jaccard"], cur["containment"]):
            best[r[P.TASK_ID]] = {"corpus_id": r[P.CORPUS_ID], "jaccard": float(r[P.JACCARD]),
                                  "containment": float(r[P.CONTAINMENT])}
    return best


def curves(card: DetectorCard, names: list[str]) -> dict:
    """ROC and PR per detector on the card's held-out shadow rows (thinned for the report)."""
    from sklearn.metrics import precision_recall_curve, roc_curve

    out = {}
    for name in names:
        y, s = card.val_scores(name)
        fpr, tpr, _ = roc_curve(y, s)
        prec, rec, _ = precision_recall_curve(y, s)
        out[name] = {"roc": {"fpr": _thin(fpr), "tpr": _thin(tpr)}, "pr": {"recall": _thin(rec), "precision": _thin(prec)}}
    return out


def _thin(v) -> list[float]:
    v = np.asarray(v, dtype=np.float64)
    if len(v) > CURVE_POINTS:
        v = v[np.linspace(0, len(v) - 1, CURVE_POINTS).round().astype(int)]
    return [round(float(x), 5) for x in v]


def top_detectors(dmeta: dict, scores: dict, primary: str, n: int = 8) -> list[str]:
    """The primary detector and the best others by shadow-validation AUC (a readable plot)."""
    ranked = sorted((d for d in dmeta if d in scores), key=lambda d: -(dmeta[d]["validation"].get("auc") or 0))
    return [primary] + [d for d in ranked if d != primary][: n - 1]


def truth_check(member: np.ndarray, scores: dict[str, np.ndarray]) -> dict | None:
    """With a planted target the truth is known: each detector's AUC on the target itself."""
    from sklearn.metrics import roc_auc_score

    if (member < 0).any() or len(np.unique(member)) < 2:
        return None
    return {n: round(float(roc_auc_score(member, s)), 4) for n, s in scores.items()}


def write_audit_report(run_dir: Path, cfg, tasks: list[dict], card: DetectorCard, isolation: str,
                       timings: dict) -> dict:
    from leakray.pipelines.audit import benchmark_file, closest_completion, member_scores_table, pass_at_1

    a = cfg.audit
    target = pq.read_table(run_dir / "collect_target" / "collection.parquet")
    task_ids = target.column(C.TASK_ID).to_pylist()
    member = target.column(C.MEMBER).to_numpy().astype(np.int64)
    scores, skipped = card.score(target)
    primary = choose_primary(card, list(scores), a.detector)
    cal = card.calibrator(primary)
    score = scores[primary]
    prob = cal.predict(score)
    cut = card.meta["detectors"][primary]["suspect_cut"]
    evidence = screening_evidence(run_dir, cfg.benchmark.name)
    confirmed = np.array([t in evidence for t in task_ids])  # every pair reported cleared the screener's bar
    suspected = (score >= cut["cut"]) & ~confirmed
    verdict = np.where(confirmed, "confirmed", np.where(suspected, "suspected", "clean"))

    val_y, val_s = card.val_scores(primary)
    prevalence = estimate_prevalence(score, val_y, val_s, cal.predict, method=a.prevalence_method,
                                     n_boot=a.bootstrap, seed=a.shadow_seed)
    if (member >= 0).all():
        prevalence["truth"] = float(member.mean())
    if confirmed.any():  # near-duplicates are leaks whatever the detector says: a floor for the estimate
        prevalence["confirmed_share"] = float(confirmed.mean())
    pass1 = pass_at_1(target)
    infl = inflation(pass1, verdict != "clean", n_boot=a.bootstrap, seed=a.shadow_seed)
    closest, similarity = closest_completion(target)

    by_id = {t[T.TASK_ID]: t for t in tasks}
    samples = [{
        "task_id": t, "prompt": by_id[t][T.PROMPT], "reference": by_id[t][T.REFERENCE], "closest": closest[i],
        "closest_similarity": similarity[i], "probability": float(prob[i]), "score": float(score[i]),
        "verdict": str(verdict[i]), "passed": None if np.isnan(pass1[i]) else float(pass1[i]),
        "evidence": _evidence_text(evidence.get(t)), "member": None if member[i] < 0 else int(member[i]),
        "jaccard": (evidence.get(t) or {}).get("jaccard"), "containment": (evidence.get(t) or {}).get("containment"),
    } for i, t in enumerate(task_ids)]
    pq.write_table(pa.Table.from_pylist(samples), run_dir / "samples.parquet")
    pq.write_table(member_scores_table(task_ids, scores, member), run_dir / "scores.parquet")

    export = export_cleaned(cfg, tasks, {t for t, v in zip(task_ids, verdict) if v != "clean"}, run_dir)
    dmeta = card.meta["detectors"]
    target_auc = truth_check(member, scores)  # once: None unless the target's membership is known
    report = {
        "title": f"leakray audit: {cfg.benchmark.name} on {a.target}",
        "summary": {
            "benchmark": cfg.benchmark.name, "n_tasks": len(task_ids), "target": a.target,
            "card": card.id, "card_path": str(card.path), "primary_detector": primary,
            "prevalence": prevalence, "inflation": infl,
            "verdicts": {v: int((verdict == v).sum()) for v in VERDICTS},
            "threshold": {"fpr": a.fpr, "score": cut["cut"], "probability": float(cal.predict([cut["cut"]])[0]),
                          "shadow_tpr": cut["tpr"], "shadow_fpr": cut["fpr"]},
        },
        "detectors": {n: {**{k: dmeta[n]["validation"].get(k) for k in ("auc", "auc_ci", "tpr_at_1fpr", "tpr_at_5fpr",
                                                                         "mcc", "n_pos", "n_neg")},
                          "family": dmeta[n]["spec"]["family"], "access": dmeta[n]["spec"]["access"],
                          "brier": dmeta[n]["calibration_quality"]["brier"],
                          "target_auc": (target_auc or {}).get(n)}
                      for n in dmeta if n in scores},
        "skipped": {**card.meta.get("skipped", {}), **skipped},
        "curves": curves(card, top_detectors(dmeta, scores, primary)),
        "calibration": {**dmeta[primary]["calibration_quality"],
                        "brier_uncalibrated": dmeta[primary]["calibration_quality"]["brier_base_rate"]},
        "truth": {"planted": a.target == "planted", "member_fraction": a.member_fraction,
                  "target_auc": target_auc} if a.target == "planted" else None,
        "cleaned": export, "isolation": isolation, "stages": _stages(run_dir), "timings_s": timings,
        "config": cfg.model_dump(), "benchmark_file": benchmark_file(cfg),
    }
    write_json_atomic(run_dir / "report.json", report)
    (run_dir / "report.md").write_text(render_markdown(report))
    try:
        from leakray.report.html import write_audit_html

        write_audit_html(run_dir / "report.html", report, samples)
    except Exception as exc:  # the numbers are written; a plotting problem must not lose them
        log.warning("report.html not written: %s", exc)
    return report


def _evidence_text(e: dict | None) -> str:
    if not e:
        return ""
    return f"near-duplicate in {e['corpus_id']} (Jaccard {e['jaccard']:.2f}, containment {e['containment']:.2f})"


def export_cleaned(cfg, tasks: list[dict], flagged: set[str], run_dir: Path) -> dict:
    """The benchmark file without flagged samples, in its own format, and the removed ids."""
    from leakray.errors import BadInput
    from leakray.pipelines.audit import benchmark_file
    from leakray.screen.outputs import export_clean

    out = run_dir / "cleaned"
    out.mkdir(exist_ok=True)
    removed = sorted(flagged)
    (out / "removed_ids.txt").write_text("".join(f"{t}\n" for t in removed))
    rows = {json.loads(t[T.META]).get("source_row") for t in tasks if t[T.TASK_ID] in flagged}
    try:
        if None in rows:
            raise BadInput("the reader recorded no source_row for a flagged task")
        path = export_clean(benchmark_file(cfg), out, rows)
        return {"path": str(path.relative_to(run_dir)), "removed": len(removed), "kept": len(tasks) - len(removed),
                "removed_ids": "cleaned/removed_ids.txt"}
    except (BadInput, OSError, ValueError) as exc:
        return {"path": None, "error": str(exc), "removed": len(removed), "removed_ids": "cleaned/removed_ids.txt"}


def _stages(run_dir: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(run_dir.glob(f"*/{MARKER}"))}


def _f(v, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "–"
    return f"{v:.1%}" if pct else f"{v:.3f}"


def render_markdown(r: dict) -> str:
    s = r["summary"]
    p, i, v = s["prevalence"], s["inflation"], s["verdicts"]
    lines = [
        f"# {r['title']}", "",
        f"**Estimated leaked fraction: {_f(p['estimate'], True)}** (95% CI {_f(p['ci'][0], True)}–"
        f"{_f(p['ci'][1], True)}; {p['method']} on {s['primary_detector']}, TPR {p['tpr']:.2f} / FPR {p['fpr']:.2f} "
        f"on held-out shadow rows; raw flagged share {_f(p['classify_and_count'], True)})"
        + (f"; planted truth {_f(p['truth'], True)}" if p.get("truth") is not None else ""), "",
        f"Verdicts over {s['n_tasks']} samples: {v['confirmed']} confirmed (near-duplicate in the corpus), "
        f"{v['suspected']} suspected (score over the cut with FPR {s['threshold']['fpr']:.0%} on shadow data), "
        f"{v['clean']} clean.", "",
        f"pass@1: flagged {_f(i['pass1_flagged'])}, clean {_f(i['pass1_clean'])}, ratio {_f(i['ratio'])}"
        + (f" (95% CI {_f(i['ratio_ci'][0])}–{_f(i['ratio_ci'][1])})" if i.get("ratio_ci") else "")
        + (f" — {i['why']}" if i.get("why") else "")
        + f". Score on all samples {_f(i['score_all'])}, on clean samples only {_f(i['score_clean'])}.", "",
        f"Detector card {s['card']}; calibration {r['calibration']['method']} (Brier {r['calibration']['brier']:.3f} "
        f"vs {r['calibration']['brier_uncalibrated']:.3f} for the base rate). Cleaned benchmark: "
        f"{r['cleaned'].get('path') or r['cleaned'].get('error')} ({r['cleaned']['removed']} removed).", "",
        "| detector | family | shadow-validation AUC | 95% CI | TPR@5%FPR |" + (" AUC on the target (truth) |" if r.get("truth") else ""),
        "|---|---|---|---|---|" + ("---|" if r.get("truth") else ""),
    ]
    for name, d in sorted(r["detectors"].items(), key=lambda kv: -(kv[1]["auc"] or 0)):
        ci = d.get("auc_ci") or [None, None]
        lines.append(f"| {name} | {d['family']} | {_f(d['auc'])} | {_f(ci[0])}–{_f(ci[1])} | {_f(d['tpr_at_5fpr'])} |"
                     + (f" {_f(d.get('target_auc'))} |" if r.get("truth") else ""))
    if r.get("skipped"):
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in r["skipped"].items())]
    errors = {name: st["errors"] for name, st in (r.get("stages") or {}).items() if st.get("errors")}
    if errors:  # degraded rows, and rows that failed for good (no verdict: ids in <stage>/errors.parquet)
        lines += ["", "Row errors by stage: " + "; ".join(f"{name} {e}" for name, e in errors.items())]
    lines += ["", "Per-sample verdicts: samples.parquet and report.html."]
    return "\n".join(lines) + "\n"
