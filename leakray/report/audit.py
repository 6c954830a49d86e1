"""An audit's verdicts and report: per sample a calibrated membership probability and one
verdict, per benchmark the leaked fraction with its interval, the score inflation, the
cleaned benchmark; report.json (every number), report.md (a pull-request comment),
report.html (plots and the per-sample table), samples.parquet, scores.parquet."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.detect.card import DetectorCard
from leakray.evaluate import selfcal
from leakray.evaluate.audit_routes import card_estimate, decide, flags_of
from leakray.data.registry import benchmark_path
from leakray.evaluate.inflation import inflation, pass_at_1
from leakray.evaluate.resample import group_index
from leakray.models.host import host_fingerprint
from leakray.report.audit_markdown import render_markdown
from leakray.runs import MARKER, write_json_atomic
from leakray.screen.siblings import SIBLINGS, copy_groups, task_near_copies
from leakray.schema import C, P, S, T

log = logging.getLogger(__name__)
VERDICTS = ("confirmed", "suspected", "clean")
CURVE_POINTS = 200


def choose_primary(card: DetectorCard, usable: list[str], requested: str | None) -> str:
    """The detector behind probabilities and verdicts: the one asked for, else the best
    shadow-validation AUC among those the target's collection can feed (ties: a detector that
    learnt nothing, then by name)."""
    from leakray.errors import BadInput

    if requested:
        if requested not in usable:
            raise BadInput(f"audit.detector {requested!r} cannot score this target (usable: {', '.join(usable)})",
                           field="audit.detector")
        return requested
    if not usable:
        raise BadInput("no detector of the card can score this target's collection")
    auc = {n: card.meta["detectors"][n]["validation"].get("auc") or 0.0 for n in usable}
    # on a tie, one that learnt nothing from the shadow's tasks: cross-fitting leaves a learned
    # detector only the tasks the card held out, so it would estimate from half the benchmark
    learns = {n: bool(card.meta["detectors"][n]["spec"].get("learns")) for n in usable}
    return sorted(usable, key=lambda n: (-auc[n], learns[n], n))[0]


def by_access(card: DetectorCard, target: pa.Table) -> tuple[str, list[str], dict[str, str]]:
    """(what the target's model gives, the card detectors that access allows, the others with
    why): an endpoint without log-probabilities runs every text-only detector and no other."""
    from leakray.detect import registry
    from leakray.detect.base import access_allows, collection_access

    access = collection_access(target)
    allowed, skipped = [], {}
    for name in card.names:
        needed = registry.spec(name).access
        if access_allows(access, needed):
            allowed.append(name)
        else:
            skipped[name] = f"needs {needed} access; the target gives {access}"
    return access, allowed, skipped


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
    out = {}
    for n, s in scores.items():
        ok = np.isfinite(s)  # a cross-fitted detector scored only held-out tasks
        out[n] = round(float(roc_auc_score(member[ok], s[ok])), 4) if len(np.unique(member[ok])) == 2 else None
    return out


def write_audit_report(run_dir: Path, cfg, tasks: list[dict], card: DetectorCard, isolation: str,
                       timings: dict) -> dict:
    from leakray.detect import registry

    a = cfg.audit
    target = pq.read_table(run_dir / "collect_target" / "collection.parquet")
    task_ids = target.column(C.TASK_ID).to_pylist()
    member = target.column(C.MEMBER).to_numpy().astype(np.int64)
    access, allowed, skipped_access = by_access(card, target)
    scores, skipped = card.score(target, allowed)
    skipped.update(skipped_access)
    by_id = {t[T.TASK_ID]: t for t in tasks}
    pairs = task_near_copies([by_id[t] for t in task_ids])  # near-copies among the audited tasks
    crossfit = crossfit_scores(card, task_ids, scores, pairs)
    primary = choose_primary(card, list(scores), a.detector)
    cal = card.calibrator(primary)
    score = scores[primary]
    prob = cal.predict(np.nan_to_num(score, nan=-np.inf))
    evidence = screening_evidence(run_dir, cfg.benchmark.name)
    confirmed = np.array([t in evidence for t in task_ids])  # every pair reported cleared the screener's bar

    val_y, val_s = card.shadow_scores(primary)  # a detector that learns nothing: every shadow row
    groups = copy_groups(pairs)  # a near-copy group is one draw of the routes' bootstraps
    units = group_index(task_ids, groups)
    card_result = card_estimate(score, val_y, val_s, prob, float(val_y.mean()), fdr=a.fdr, seed=a.shadow_seed,
                                n_boot=min(a.bootstrap, 200), max_width=a.max_width,
                                groups=units)
    selfcal_result = self_calibrated(target, a, groups)
    control_result = control_route(run_dir, task_ids, a, groups)
    if control_result is not None:  # control tasks left out as near-copies of benchmark tasks (load_control)
        control_result["near_copies_left_out"] = _stage_info(run_dir, "control_scores").get("near_copies_left_out", [])
    decision = decide(selfcal_result, card_result, a.route, card_leak=card.meta["shadow"].get("leak"),
                      control_result=control_result)
    suspected = flags_of(decision, selfcal_result, card_result, len(task_ids), control_result) & ~confirmed
    verdict = np.where(confirmed, "confirmed", np.where(suspected, "suspected", "clean"))
    if (member >= 0).all():
        decision["truth"] = float(member.mean())
    if confirmed.any():  # near-duplicates are leaks whatever the detector says: a floor for the estimate
        decision["confirmed_share"] = float(confirmed.mean())
    pass1 = pass_at_1(target)
    infl = inflation(pass1, verdict != "clean", n_boot=a.bootstrap, seed=a.shadow_seed,
                     groups=units)
    infl["null"] = inflation_null(card, task_ids, verdict != "clean", infl, a, groups=units)
    # one story: the p- and q-values beside the verdicts are the flagging route's own
    pq_route = control_result if decision.get("flags_from") == "control" else selfcal_result
    p_task = _per_task(pq_route, len(task_ids), "p")
    q_task = _per_task(pq_route, len(task_ids), "q")
    closest, similarity = closest_completion(target)

    copies = benchmark_near_copies(pairs, task_ids, verdict)
    samples = [{
        "task_id": t, "prompt": by_id[t][T.PROMPT], "reference": by_id[t][T.REFERENCE], "closest": closest[i],
        "closest_similarity": similarity[i], "probability": _num(card_result["posterior"][i]),
        "score": _num(score[i]), "p_value": _num(p_task[i]), "q_value": _num(q_task[i]),
        "verdict": str(verdict[i]), "passed": None if np.isnan(pass1[i]) else float(pass1[i]),
        "evidence": _evidence_text(evidence.get(t)), "member": None if member[i] < 0 else int(member[i]),
        "jaccard": (evidence.get(t) or {}).get("jaccard"), "containment": (evidence.get(t) or {}).get("containment"),
        "near_copies": copies["of"].get(t, []),
    } for i, t in enumerate(task_ids)]
    pq.write_table(pa.Table.from_pylist(samples), run_dir / "samples.parquet")
    pq.write_table(member_scores_table(task_ids, scores, member), run_dir / "scores.parquet")

    copies["dropped"] = a.cleaned_near_copies == "drop"
    export = export_cleaned(cfg, tasks, {t for t, v in zip(task_ids, verdict) if v != "clean"}, run_dir,
                            also=copies["clean_copies_of_flagged"] if copies["dropped"] else ())
    dmeta = card.meta["detectors"]
    target_auc = truth_check(member, scores)  # once: None unless the target's membership is known
    collected = _stage_info(run_dir, "collect_target")
    report = {
        "title": f"leakray audit: {cfg.benchmark.name} on {a.target}",
        "summary": {
            "benchmark": cfg.benchmark.name, "n_tasks": len(task_ids), "target": a.target,
            "card": card.id, "card_path": str(card.path), "primary_detector": primary,
            "access": access, "detectors_run": sorted(scores), "chat_api": chat_api(cfg, collected),
            "leaked_fraction": decision, "inflation": infl,
            "self_calibrated": _public(selfcal_result), "card_route": _public(card_result),
            "control": _public(control_result),
            "rewrite_test": rewrite_test(run_dir, task_ids, a),
            "crossfit": crossfit, "suspected_means": f"q-value <= {a.fdr} (expected share of false leaks among the "
                                                    "suspected samples), from the route that gave the number"
                                                    + (" (the control route: Benjamini–Hochberg on conformal p-values)"
                                                       if pq_route is control_result else ""),
            "verdicts": {v: int((verdict == v).sum()) for v in VERDICTS},
            "near_copies": {k: v for k, v in copies.items() if k != "of"},
            "reference_model": collected.get("reference_model"),
            "shadow_vs_target": shadow_vs_target(card, cfg),
        },
        "detectors": {n: {**{k: dmeta[n]["validation"].get(k) for k in ("auc", "auc_ci", "tpr_at_1fpr", "tpr_at_5fpr",
                                                                         "mcc", "n_pos", "n_neg")},
                          # the access this version gives the detector (what `by_access` checked), not
                          # the one stored with the card when it was built
                          "family": dmeta[n]["spec"]["family"], "access": registry.spec(n).access,
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
        "environment": host_fingerprint(),  # the driver's host: the scores' kernels (leakray.models.host)
        "config": cfg.model_dump(), "benchmark_file": benchmark_path(cfg.benchmark.name, cfg.benchmark.path),
    }
    write_json_atomic(run_dir / "report.json", report)
    (run_dir / "report.md").write_text(render_markdown(report))
    try:
        from leakray.report.html import write_audit_html

        write_audit_html(run_dir / "report.html", report, samples)
    except Exception as exc:  # the numbers are written; a plotting problem must not lose them
        log.warning("report.html not written: %s", exc)
    return report


def crossfit_scores(card: DetectorCard, task_ids: list[str], scores: dict[str, np.ndarray],
                    pairs: list[tuple[str, str, float]] = ()) -> dict:
    """No target task is scored by a detector trained on it or on a near-copy of it (``pairs``,
    `siblings.task_near_copies`): a learned detector's scores on the card's fit-half tasks and their copies
    become NaN (left out of its estimate). A card whose halves kept near-copies together
    (`benchmark.near_copies`) has no copy outside its fit half; an older card, or one built on
    another version of the benchmark, may. Returns what was left out."""
    fit = set(card.meta.get("fit_task_ids") or [])
    if not fit and card.meta.get("benchmark", {}).get("n_tasks") == len(task_ids):  # cards before fit_task_ids
        fit = set(task_ids) - set(card.meta.get("val_task_ids", []))
    copies = sorted({b for a, b, _ in pairs if a in fit and b not in fit}
                    | {a for a, b, _ in pairs if b in fit and a not in fit})
    mask = np.array([t in fit or t in copies for t in task_ids])
    out = {}
    for name in scores:
        if card.meta["detectors"][name]["spec"].get("learns") and mask.any():
            scores[name] = np.where(mask, np.nan, scores[name])
            out[name] = int(mask.sum())
    return {"left_out_tasks": int(mask.sum()), "detectors": sorted(out), "copies_of_fit_tasks": copies,
            "why": "learned detectors score only the tasks the card held out from their training, and no "
                   "near-copy of a task they trained on"}


def chat_api(cfg, collected: dict) -> dict | None:
    """For a target read through a chat API (`sample.endpoint_api=chat`): how many rows' answers
    needed their fences, a sentence or the given code taken off (the target collection's stats,
    ``collected``: its `chat_answers`)."""
    if cfg.sample.endpoint_api != "chat":  # only with the openai backend (config.py)
        return None
    from leakray.models import chat

    answers = collected.get("chat_answers") or {}
    return {"rows": collected.get("rows_out"),
            "answers": {n: answers.get(n, 0) for n in (chat.FENCED, chat.PROSE, chat.REPEATED)}}


def self_calibrated(target: pa.Table, a, groups=()) -> dict:
    """The self-calibrated route on the target's own collection (its log-probabilities of each
    solution and the reference model's); ``groups``: the audited tasks' near-copy groups."""
    lr = selfcal.likelihood_ratio(target)
    s, statistic, adjustment = selfcal.route_statistic(lr, a.net_of_difficulty)
    res = selfcal.estimate_empirical(lr["task_id"], s, lr["why"], fdr=a.fdr, n_boot=min(a.bootstrap, 300),
                                     seed=a.shadow_seed, max_width=a.max_width, groups=groups,
                                     **({"statistic": statistic} if statistic else {}))
    return {**res, "adjustment": adjustment}


def control_route(run_dir: Path, task_ids: list[str], a, groups=()) -> dict | None:
    """The control route (audit.control): the benchmark's statistics against the control tasks';
    ``groups``: the audited tasks' near-copy groups."""
    from leakray.evaluate.control_route import FILE, estimate_from_table

    path = run_dir / "control_scores" / FILE
    if not path.exists():
        return None
    return estimate_from_table(pq.read_table(path), task_ids, lam=a.lam, fdr=a.fdr, n_boot=min(a.bootstrap, 300),
                               seed=a.shadow_seed, max_width=a.max_width, adjust=a.net_of_difficulty, groups=groups)


def rewrite_test(run_dir: Path, task_ids: list[str], a) -> dict | None:
    """The optional rewrite test (audit.rewrites > 0): reported beside the routes, never the number."""
    path = run_dir / "rewrite_scores" / "rewrite_scores.parquet"
    if not path.exists():
        return None
    by_id = {r["task_id"]: r for r in pq.read_table(path).to_pylist()}
    res = selfcal.estimate_rewrites([by_id[t] for t in task_ids if t in by_id], lam=a.lam, fdr=a.fdr,
                                    n_boot=min(a.bootstrap, 300), seed=a.shadow_seed)
    return {k: v for k, v in res.items() if k != "per_task"}


def inflation_null(card: DetectorCard, task_ids: list[str], flagged: np.ndarray, observed: dict, a,
                   groups: np.ndarray | None = None) -> dict:
    """The same flagged/clean pass@1 split on a model that saw none of those tasks (the card's shadow,
    on its non-member tasks): flags follow task difficulty too, so this is the difference a leak-free
    model shows; the excess over it is what the leak adds. ``groups``: the audited tasks' near-copy
    labels (`resample.group_index`), drawn whole here as in the observed split's interval."""
    path = card.path / "shadow_tasks.parquet"
    if not path.exists():
        return {"why": "the card holds no shadow pass@1 (built before this version)"}
    shadow = {r["task_id"]: r for r in pq.read_table(path).to_pylist()}
    keep = [i for i, t in enumerate(task_ids) if t in shadow and shadow[t]["member"] == 0]
    p = np.array([shadow[task_ids[i]]["pass1"] for i in keep], dtype=np.float64)
    null = inflation(p, flagged[keep], n_boot=a.bootstrap, seed=a.shadow_seed,
                     groups=None if groups is None else np.asarray(groups)[keep])
    out = {"n_tasks": len(keep), "difference": null["difference"], "difference_ci": null["difference_ci"]}
    if null["difference"] is not None and observed.get("difference") is not None:
        out["excess_difference"] = observed["difference"] - null["difference"]
    else:
        out["why"] = null.get("why", "no difference observed")
    return out


def shadow_vs_target(card: DetectorCard, cfg) -> dict:
    """Whether the card's shadow and the target share a base: known for a planted target only."""
    shadow = card.meta.get("shadow", {}).get("base")
    planted = cfg.audit.target == "planted"
    target = (cfg.audit.planted_base or cfg.model.base) if planted else cfg.audit.target
    differ = (shadow != target) if planted else None
    note = (None if differ is False else
            f"the card's shadow was built on {shadow}" + (f", the target on {target}" if planted else
                                                           "; the target's own base is unknown to the audit")
            + ": the card route holds only where its transfer check passes; the self-calibrated route does not "
              "depend on the shadow")
    # how the card's shadow saw its members: the strength of leak the card route counts (cards made
    # before leak kinds were recorded were fine-tuned)
    leak = card.meta.get("shadow", {}).get("leak") or {"mode": "finetune"}
    return {"shadow_base": shadow, "target": target, "differ": differ, "note": note, "shadow_leak": leak}


def _per_task(result: dict | None, n: int, key: str) -> np.ndarray:
    return np.full(n, np.nan) if result is None else result["per_task"][key]


def _num(v) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def _public(result: dict | None) -> dict | None:
    """A route's result without its per-task arrays (those are in samples.parquet)."""
    if result is None:
        return None
    return {k: v for k, v in result.items() if k not in ("per_task", "posterior", "flagged")}


def _stage_info(run_dir: Path, name: str) -> dict:
    p = run_dir / name / MARKER
    return json.loads(p.read_text()) if p.exists() else {}


def _evidence_text(e: dict | None) -> str:
    if not e:
        return ""
    return f"near-duplicate in {e['corpus_id']} (Jaccard {e['jaccard']:.2f}, containment {e['containment']:.2f})"


def benchmark_near_copies(pairs: list[tuple[str, str, float]], task_ids: list[str], verdict: np.ndarray) -> dict:
    """The audited tasks whose solutions nearly copy each other (``pairs``, `siblings.task_near_copies`): a
    model that saw one saw the other's solution. ``of``: each task's copies; the clean tasks among
    them whose copy was flagged are named (the cleaned file drops them with it, or keeps them:
    `audit.cleaned_near_copies`)."""
    of: dict[str, list[str]] = {}
    for a, b, _ in pairs:
        of.setdefault(a, []).append(b)
        of.setdefault(b, []).append(a)
    flagged = {t for t, v in zip(task_ids, verdict) if v != "clean"}
    clean = [t for t in task_ids if t in of and t not in flagged and any(o in flagged for o in of[t])]
    return {"threshold": SIBLINGS.threshold, "ngram": SIBLINGS.ngram, "pairs": [list(p) for p in pairs], "of": of,
            "clean_copies_of_flagged": clean}


def export_cleaned(cfg, tasks: list[dict], flagged: set[str], run_dir: Path, also: Iterable[str] = ()) -> dict:
    """The benchmark file without flagged samples, in its own format, and the removed ids. An audit
    of the first ``benchmark.limit`` tasks judged no other: those are left out too, and counted
    (``not_audited``), so that the cleaned file holds only tasks the audit found clean. ``also``:
    clean tasks removed with them (near-copies of flagged ones, `audit.cleaned_near_copies`),
    listed in removed_ids.txt and counted (``near_copies_removed``)."""
    also = set(also) - set(flagged)
    flagged = set(flagged) | also
    from leakray.data.registry import load_benchmark
    from leakray.errors import BadInput
    from leakray.screen.outputs import export_clean

    out = run_dir / "cleaned"
    out.mkdir(exist_ok=True)
    removed = sorted(flagged)
    (out / "removed_ids.txt").write_text("".join(f"{t}\n" for t in removed))

    def source_row(task: dict):
        return json.loads(task[T.META]).get("source_row")

    rows = {source_row(t) for t in tasks if t[T.TASK_ID] in flagged}
    not_audited: set = set()
    try:
        if cfg.benchmark.limit:
            audited = {t[T.TASK_ID] for t in tasks}
            not_audited = {source_row(t) for t in load_benchmark(cfg.benchmark.name, cfg.benchmark.path)
                           if t[T.TASK_ID] not in audited}
        if None in rows | not_audited:
            raise BadInput("the reader recorded no source_row for a flagged task")
        path = export_clean(benchmark_path(cfg.benchmark.name, cfg.benchmark.path), out, rows | not_audited)
        return {"path": str(path.relative_to(run_dir)), "removed": len(removed), "kept": len(tasks) - len(removed),
                "not_audited": len(not_audited), "near_copies_removed": len(also),
                "removed_ids": "cleaned/removed_ids.txt"}
    except (BadInput, OSError, ValueError) as exc:
        return {"path": None, "error": str(exc), "removed": len(removed), "near_copies_removed": len(also),
                "removed_ids": "cleaned/removed_ids.txt"}


def _stages(run_dir: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(run_dir.glob(f"*/{MARKER}"))}


def closest_completion(table: pa.Table) -> tuple[list[str | None], list[float | None]]:
    """The completion nearest the reference (smallest token edit distance) and 1 - that distance."""
    comps, dists = table.column(C.COMPLETIONS).to_pylist(), table.column(C.EDIT_DISTANCE).to_pylist()
    best, sim = [], []
    for c, d in zip(comps, dists):
        if not c or not d:
            best.append(None)
            sim.append(None)
            continue
        i = int(np.argmin(d))
        best.append(c[i])
        sim.append(float(1.0 - d[i]))
    return best, sim


def member_scores_table(task_ids: list[str], scores: dict[str, np.ndarray], member) -> pa.Table:
    parts = [pa.table({S.TASK_ID: task_ids, S.DETECTOR: [n] * len(task_ids), S.SCORE: s.astype(np.float64),
                       S.MEMBER: np.asarray(member, np.int8)}) for n, s in scores.items()]
    return pa.concat_tables(parts) if parts else pa.table({S.TASK_ID: pa.array([], pa.string())})
