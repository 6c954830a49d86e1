"""The audit's validation matrix: `leakray audit` on targets whose truth this script knows, as a
user would run it (the target is a model path or an endpoint; the audit is not told the truth).

Targets (HumanEval, 164 tasks; members drawn by task with a seed the audit never sees):
- twin fine-tunes of the tiny base at 0 / 20 / 50% (15 epochs, the simulated-leak protocol's leak),
  weaker ones (`twin-e3-20`, `twin-e6-20`: 3 and 6 epochs on 20%) and a small share (`twin-5`);
- the other local architecture: tiny targets audited with a `tiny-alt` card, and `tiny-alt`
  targets audited with the default `tiny` card, at 0 / 20%;
- pretraining mixtures (`leak.mode=pretrain-mix`): the tiny base continued on ~0.9M tokens of clean
  code with 25% of the tasks inserted 4 or 16 times;
- the clean tiny base served through the OpenAI-compatible endpoint backend (truth 0%);
- `endpoint-noecho-*`: served by an endpoint that refuses `echo` (it scores no given text, but
  returns the log-probabilities of what it samples): the clean base and a 20% twin;
- `endpoint-chat-*`: served only as a chat (`sample.endpoint_api=chat`): each text asked for in
  words, each answer a sentence and a fence around the given code written out again before the
  continuation (the server's `prose_repeat` style); the clean base and a 20% twin;
- `mixcard-*`: the same kinds of target audited with a card whose shadow carries a
  pretraining-mixture leak (`leak.mode=pretrain-mix`, each shadow member read 16 times);
- `ctrl-*`: the control route — a seeded third of HumanEval (55 tasks) is given as control tasks
  (`--control`: tasks the target cannot have seen), the audit runs on the other 109; a clean
  target, pretraining mixtures with 25% of the 109 inserted 4 or 16 times, and a twin fine-tune
  on 20% of them;
- every target's self-calibrated route again with the *oracle* reference model (the target's own
  pre-leak checkpoint), for comparison with the default non-oracle reference.

One table: estimate, interval, truth, error, covered, the route that produced the number (or the
audit's statement that it cannot estimate, and why), the card route's primary detector.

    python benchmarks/audit_matrix.py --output /tmp/matrix            # everything (about an hour here)
    python benchmarks/audit_matrix.py --output /tmp/matrix --only twin-0,mix-d16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SETTINGS = ["sample.k=2", "sample.max_new_tokens=96", "columns.upper_case=false"]

# name: (target base, how it leaked, member fraction, dose, card)
TARGETS = {
    "twin-0": ("tiny", "none", 0.0, 0, "tiny"),
    "twin-20": ("tiny", "finetune", 0.2, 0, "tiny"),
    "twin-50": ("tiny", "finetune", 0.5, 0, "tiny"),
    # leaks between the twin's and a mixture's: fewer epochs of the same fine-tune (the dose field
    # counts epochs for a fine-tune; 0 is the config's 15), and a small share at full strength
    "twin-e3-20": ("tiny", "finetune", 0.2, 3, "tiny"),
    "twin-e6-20": ("tiny", "finetune", 0.2, 6, "tiny"),
    "twin-5": ("tiny", "finetune", 0.05, 0, "tiny"),
    "altcard-tiny-0": ("tiny", "none", 0.0, 0, "tiny-alt"),
    "altcard-tiny-20": ("tiny", "finetune", 0.2, 0, "tiny-alt"),
    "alt-0": ("tiny-alt", "none", 0.0, 0, "tiny"),
    "alt-20": ("tiny-alt", "finetune", 0.2, 0, "tiny"),
    "mix-d4": ("tiny", "pretrain-mix", 0.25, 4, "tiny"),
    "mix-d16": ("tiny", "pretrain-mix", 0.25, 16, "tiny"),
    "endpoint-clean": ("tiny", "endpoint", 0.0, 0, "tiny"),
    # served by an endpoint that returns its samples' log-probabilities but refuses `echo` (scores no
    # given text, as many hosted APIs): access "sampled logprobs", a clean target and a 20% twin
    "endpoint-noecho-clean": ("tiny", "endpoint", 0.0, 0, "tiny"),
    "endpoint-noecho-twin-20": ("tiny", "finetune", 0.2, 0, "tiny"),
    # served only as a chat: no echo, no one-token draws, the continuation read out of each answer
    "endpoint-chat-clean": ("tiny", "endpoint", 0.0, 0, "tiny"),
    "endpoint-chat-twin-20": ("tiny", "finetune", 0.2, 0, "tiny"),
    # a card whose shadow read its half of the tasks 16 times each in a pretraining mixture
    "mixcard-d16": ("tiny", "pretrain-mix", 0.25, 16, "tiny+mix16"),
    "mixcard-d4": ("tiny", "pretrain-mix", 0.25, 4, "tiny+mix16"),
    "mixcard-clean": ("tiny", "none", 0.0, 0, "tiny+mix16"),
    "mixcard-twin-20": ("tiny", "finetune", 0.2, 0, "tiny+mix16"),
    # the control route: a third of HumanEval given as tasks the target cannot have seen (CONTROL_SEED),
    # the audit on the rest, members drawn from the rest
    "ctrl-clean": ("tiny", "none", 0.0, 0, "tiny"),
    "ctrl-mix-d4": ("tiny", "pretrain-mix", 0.25, 4, "tiny"),
    "ctrl-mix-d16": ("tiny", "pretrain-mix", 0.25, 16, "tiny"),
    "ctrl-twin-20": ("tiny", "finetune", 0.2, 0, "tiny"),
}
LOG = sys.stderr
MEMBER_SEED = 31  # not the audit's default seeds: the audit cannot know the members
CONTROL_SEED, CONTROL_SHARE = 41, 1 / 3  # the ctrl-* rows' control tasks, never in their benchmark


def control_split(tasks: list[dict], out: Path) -> tuple[list[dict], Path, Path]:
    """The ctrl-* rows' benchmark (the tasks outside the control third) and the two files, in
    HumanEval's own format, that the audit reads (--benchmark humaneval=..., --control ...=...)."""
    import gzip

    from leakray.data.humaneval import packaged_path
    from leakray.protocols.audit import split_members
    from leakray.schema import T

    control = set(split_members([t[T.TASK_ID] for t in tasks], CONTROL_SHARE, CONTROL_SEED, *copy_groups(tasks)))
    with gzip.open(packaged_path(), "rt") as fh:
        raw = [json.loads(line) for line in fh if line.strip()]
    d = out / "control"
    d.mkdir(parents=True, exist_ok=True)
    bench, ctrl = d / "benchmark.jsonl", d / "control.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in raw if r["task_id"] not in control))
    ctrl.write_text("".join(json.dumps(r) + "\n" for r in raw if r["task_id"] in control))
    return [t for t in tasks if t[T.TASK_ID] not in control], bench, ctrl


def copy_groups(tasks: list[dict]) -> tuple[list[list[str]], dict[str, int]]:
    """The benchmark's near-copy groups and reference lengths, for `split_members`: a split keeps
    each group on one side, as the audit's own splits do (`benchmark.near_copies`), so that a
    target's truth never calls a member's near-copy unseen and no control task copies a member."""
    from leakray.config import AuditConfig
    from leakray.protocols.simulate import copy_groups_of
    from leakray.schema import T

    return copy_groups_of(AuditConfig(), tasks), {t[T.TASK_ID]: len(t[T.REFERENCE]) for t in tasks}


def base_path(cfg, which: str) -> str:
    from leakray.protocols.simulate import model_path

    return model_path(cfg, which)


def build_target(name: str, spec: tuple, cfg, tasks: list[dict], out: Path) -> dict:
    """The target model (cached in out/targets/<key>) and its true members."""
    from leakray.config import to_stage
    from leakray.protocols.audit import split_members
    from leakray.protocols.simulate import training_text
    from leakray.runs import content_hash, write_json_atomic
    from leakray.schema import T

    base, how, fraction, dose, _ = spec
    members = split_members([t[T.TASK_ID] for t in tasks], fraction, MEMBER_SEED, *copy_groups(tasks))
    key = f"{base}-{how}-{fraction}-{dose}" if how not in ("none", "endpoint") else f"{base}-clean"
    if name.startswith("ctrl-") and how not in ("none", "endpoint"):
        key = f"ctrl-{key}"  # members drawn from the control rows' benchmark, not from all 164 tasks
    if how not in ("none", "endpoint"):  # a stored target is reused only for the members it was trained on
        key = f"{key}-{content_hash(members)[:8]}"
    model = out / "targets" / key
    texts = [training_text(t) for t in tasks if t[T.TASK_ID] in set(members)]
    if how in ("none", "endpoint"):
        return {"path": base_path(cfg, base), "members": [], "base": base}
    if not (model / "truth.json").exists():
        t0 = time.perf_counter()
        if how == "finetune":
            from dataclasses import replace

            from leakray.models.finetune import finetune

            stage = to_stage(cfg.target)
            finetune(base_path(cfg, base), texts, replace(stage, epochs=dose) if dose else stage, model, progress=False)
        else:
            from transformers import AutoTokenizer

            from leakray.leak.corpus import clean_corpus
            from leakray.leak.mixture import build_mixture
            from leakray.leak.pretrain import continue_pretrain

            mix = cfg.leak.mix(dose=dose)
            corpus, _ = clean_corpus(tasks, mix.corpus_max_bytes, mix.seed)
            tok = AutoTokenizer.from_pretrained(base_path(cfg, base))
            m = build_mixture(tok, corpus, texts, dose, mix.n_tokens, mix.seq_len, mix.seed)
            continue_pretrain(base_path(cfg, base), m.sequences, mix, model, progress=False)
        write_json_atomic(model / "truth.json", {"members": members, "seconds": time.perf_counter() - t0})
    return {"path": str(model), "members": members, "base": base}


def build_card(which: str, out: Path) -> Path:
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.console import Console
    from leakray.protocols.audit import run_audit

    base, _, leak = which.partition("+")  # "tiny+mix16": the shadow's leak is a pretraining mixture, dose 16
    leak_settings = [f"leak.mode=pretrain-mix", f"leak.dose={int(leak.removeprefix('mix'))}"] if leak else []
    cfg = load_config([AUDIT_DEFAULTS], SETTINGS + leak_settings + [f"model.base={base}", f"output_dir={out / 'runs'}"],
                      AuditConfig)
    return run_audit(cfg, Console(stream=LOG), card_only=True)


def flaky(body: dict, n: int) -> str | None:
    """The endpoint's injected faults: rate limits, server errors, a slow reply, malformed answers."""
    for every, fault in ((7, "429:0.2"), (11, "503"), (17, "garbage"), (23, "no_choices"), (29, "sleep:1")):
        if n % every == 0:
            return fault
    return None


def no_echo(body: dict, n: int) -> str | None:
    """The same faults, and `echo` refused as a hosted API refuses it."""
    return "400:echo is not supported for this model" if body.get("echo") else flaky(body, n)


SERVED = {"endpoint-clean": flaky, "endpoint-noecho-clean": no_echo, "endpoint-noecho-twin-20": no_echo,
          "endpoint-chat-clean": flaky, "endpoint-chat-twin-20": flaky}
# rows served as a chat: the server's answer style (leakray.models.endpoint_server.CHAT_STYLES)
CHAT = {"endpoint-chat-clean": "prose_repeat", "endpoint-chat-twin-20": "prose_repeat"}


def audit(target: dict, card: Path, out: Path, reference: str, extra: list[str] = (), served=None,
          chat_style: str | None = None) -> Path:
    """The audit of ``target`` (a model path), or of the same model behind a local endpoint whose
    requests pass the fault hook ``served`` (through its chat API, answering in ``chat_style``,
    when one is given)."""
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.console import Console
    from leakray.protocols.audit import run_audit

    overrides = SETTINGS + [f"audit.card={card}", f"audit.target={target['path']}", f"output_dir={out / 'runs'}",
                            f"audit.reference_model={reference}", *extra]
    if served is None:
        return run_audit(load_config([AUDIT_DEFAULTS], overrides, AuditConfig), Console(stream=LOG))
    from leakray.models.endpoint_server import CompletionServer, HFBackend

    backend = HFBackend(target["path"], threads=1, chat_style=chat_style or "plain")
    with CompletionServer(backend, fault=served, lifetime_s=3600) as srv:
        overrides += ["sample.backend=openai", f"sample.endpoint_url={srv.url}", "audit.target=tiny-served",
                      "sample.backoff_s=0.2", "sample.max_retries=8"]
        overrides += ["sample.endpoint_api=chat"] if chat_style else []
        return run_audit(load_config([AUDIT_DEFAULTS], overrides, AuditConfig), Console(stream=LOG))


def oracle_selfcal(run_dir: Path, cfg, oracle: str) -> dict:
    """The self-calibrated route again with the oracle reference (the target's own pre-leak
    checkpoint): the target's log-probabilities from its collection, the oracle's scored here
    (solution and prompt, as the collection's reference-model columns hold them)."""
    import math

    import pyarrow as pa
    import pyarrow.parquet as pq

    from leakray.config import to_stage
    from leakray.evaluate import selfcal
    from leakray.models.backends import make_sampler
    from leakray.models.sampler import SampleConfig
    from leakray.schema import C

    table = pq.read_table(run_dir / "collect_target" / "collection.parquet")
    sampler = make_sampler(base_path(cfg, oracle), SampleConfig(**{**to_stage(cfg.sample).__dict__, "backend": "hf"}))
    got = sampler.reference_scores(table.column(C.PROMPT).to_pylist(), table.column(C.REFERENCE).to_pylist())
    sums = [[math.fsum(g.logprobs)] if g.logprobs else None for g in got]  # the statistic reads only sums
    ctx = [None if math.isnan(g.context_logprob) else g.context_logprob for g in got]
    table = table.set_column(table.schema.get_field_index(C.REFMODEL_TOKEN_LOGPROBS), C.REFMODEL_TOKEN_LOGPROBS,
                             pa.array(sums, pa.list_(pa.float32())))
    if C.REFMODEL_PROMPT_LOGPROB in table.column_names:
        table = table.set_column(table.schema.get_field_index(C.REFMODEL_PROMPT_LOGPROB), C.REFMODEL_PROMPT_LOGPROB,
                                 pa.array(ctx, pa.float64()))
    lr = selfcal.likelihood_ratio(table)
    s, _, _ = selfcal.route_statistic(lr, cfg.audit.net_of_difficulty)  # as the audit's route reads it
    return selfcal.estimate_empirical(lr["task_id"], s, lr["why"], n_boot=300, seed=12)


def row(name: str, spec: tuple, target: dict, report: dict, n_tasks: int, reference: str) -> dict:
    s = report["summary"]
    truth = len(target["members"]) / n_tasks
    est, ci = s["leaked_fraction"]["estimate"], s["leaked_fraction"]["ci"]
    members = set(target["members"])
    flagged_clean = None  # share of the target's non-members the verdicts flag
    import pyarrow.parquet as pq

    samples = pq.read_table(Path(report["run_dir"]) / "samples.parquet").to_pylist()
    clean = [r for r in samples if r["task_id"] not in members]
    if clean:
        flagged_clean = sum(r["verdict"] != "clean" for r in clean) / len(clean)
    # a non-member whose solution nearly copies a member's (screen/siblings.py) was read in substance
    copies = {c for r in samples if r["task_id"] in members for c in (r.get("near_copies") or [])} - members
    flagged_copies = sum(r["verdict"] != "clean" for r in clean if r["task_id"] in copies)
    return {
        "target": name, "leak": spec[1], "dose": spec[3] or None, "card": spec[4], "target_base": spec[0],
        "reference": reference, "truth": truth, "estimate": est, "ci": ci,
        "error": None if est is None else est - truth,
        "covered": None if est is None else bool(ci[0] - 1e-9 <= truth <= ci[1] + 1e-9),
        "route": s["leaked_fraction"]["route"], "statement": s["leaked_fraction"].get("statement"),
        "access": s.get("access"), "detectors_run": s.get("detectors_run"),
        "primary": s.get("primary_detector"), "flagged": s["verdicts"]["suspected"], "flagged_clean": flagged_clean,
        "flagged_copies_of_members": flagged_copies,
        "uniform_p": ((s.get("self_calibrated") or {}).get("uniformity") or {}).get("ks_p"),
        # the route's null checked where it should hold: the p-values of the target's true non-members
        "uniform_p_clean": _uniform_p([r["p_value"] for r in clean]),
        "why_self_cal": (s.get("self_calibrated") or {}).get("why_unusable"),
        "why_card": (s.get("card_route") or {}).get("why_unusable"),
        "self_cal": (s.get("self_calibrated") or {}).get("estimate"),
        "card_route": (s.get("card_route") or {}).get("estimate"),
        "control": _control_cells(s.get("control")),
        "members_auc": members_auc(Path(report["run_dir"]), members),
    }


def members_auc(run_dir: Path, members: set[str], top: int = 4) -> dict | None:
    """The best ``top`` detectors' AUC against the target's true members, on the scores the audit
    wrote (`scores.parquet`; a learned detector's cross-fitted NaNs left out); None for a clean
    target."""
    import math

    import pyarrow.parquet as pq
    from sklearn.metrics import roc_auc_score

    by_detector: dict[str, tuple[list, list]] = {}
    for r in pq.read_table(run_dir / "scores.parquet").to_pylist():
        if r["score"] is not None and math.isfinite(r["score"]):
            ys, ss = by_detector.setdefault(r["detector"], ([], []))
            ys.append(r["task_id"] in members)
            ss.append(r["score"])
    aucs = {d: round(float(roc_auc_score(y, s)), 3) for d, (y, s) in by_detector.items() if 0 < sum(y) < len(y)}
    return dict(sorted(aucs.items(), key=lambda kv: -kv[1])[:top]) or None


def _control_cells(c: dict | None) -> dict | None:
    if not c:
        return None
    return {"n_control": c.get("n_control"), "estimate": c.get("estimate"), "ci": c.get("ci"),
            "lower_bound": c.get("lower_bound"), "test_p": (c.get("test") or {}).get("p"), "usable": c.get("usable"),
            "why": c.get("why_unusable"), "exchangeable": (c.get("exchangeability") or {}).get("ok")}


def _uniform_p(p: list) -> float | None:
    """KS p of p-values against the uniform (None under 20 of them)."""
    import math

    from scipy import stats

    p = [v for v in p if v is not None and math.isfinite(v)]
    return float(stats.kstest(p, "uniform").pvalue) if len(p) >= 20 else None


def _copies(r: dict) -> str:
    n = r.get("flagged_copies_of_members")
    return f"; {n} of them a member's near-copy" if n else ""


def _leak(r: dict) -> str:
    if not r["dose"]:
        return r["leak"]
    return f"{r['leak']}, {r['dose']} epochs" if r["leak"] == "finetune" else f"{r['leak']} x{r['dose']}"


def _pct(v) -> str:
    return "–" if v is None else f"{v:.1%}"


def markdown(rows: list[dict]) -> str:
    lines = ["| target | leak | card | reference | truth | estimate | 95% CI | error | covered | route | flagged "
             "(of non-members) | self-cal / card route | p uniform (KS p): all tasks / non-members |", "|" + "---|" * 13]
    for r in rows:
        est = _pct(r["estimate"]) if r["estimate"] is not None else "not estimated (below)"
        ci = "–" if r["estimate"] is None else f"{_pct(r['ci'][0])}–{_pct(r['ci'][1])}"
        err = "–" if r["error"] is None else f"{r['error'] * 100:+.1f} pts"
        lines.append(f"| {r['target']} | {_leak(r)} | {r['card']} | "
                     f"{r['reference']} | {_pct(r['truth'])} | {est} | {ci} | {err} | "
                     f"{'–' if r['covered'] is None else ('yes' if r['covered'] else 'NO')} | {r['route']} | "
                     f"{r['flagged']} ({_pct(r['flagged_clean'])}{_copies(r)}) | {_pct(r['self_cal'])} / {_pct(r['card_route'])} | "
                     f"{'–' if r['uniform_p'] is None else format(r['uniform_p'], '.3f')} / "
                     f"{'–' if r.get('uniform_p_clean') is None else format(r['uniform_p_clean'], '.3f')} |")
    lines += ["", "Why no number, by route:", ""]
    lines += [f"- {r['target']} (access {r.get('access')}, primary {r.get('primary')}): self-calibrated — "
              f"{r['why_self_cal'] or 'used'}; card — {r['why_card'] or 'usable'}" for r in rows]
    return "\n".join(lines) + "\n"


def control_markdown(rows: list[dict]) -> str:
    rows = [r for r in rows if r.get("control")]
    if not rows:
        return ""
    lines = ["The control route (control tasks the target cannot have seen; conformal p-values):", "",
             "| target | truth | printed | control route [95% CI] | at least (one-sided 95%) | benchmark > control "
             "(Mann–Whitney p) | control tasks like the benchmark's | flagged (of non-members) |", "|" + "---|" * 8]
    for r in rows:
        c = r["control"]
        printed = (f"{_pct(r['estimate'])} [{_pct(r['ci'][0])}, {_pct(r['ci'][1])}] ({r['route']})"
                   if r["estimate"] is not None else "no share (statement below)")
        lines.append(f"| {r['target']} | {_pct(r['truth'])} | {printed} | {_pct(c['estimate'])} "
                     f"[{_pct((c['ci'] or [None])[0])}, {_pct((c['ci'] or [None, None])[1])}] | {_pct(c['lower_bound'])} | "
                     f"{'–' if c['test_p'] is None else format(c['test_p'], '.2g')} | "
                     f"{'yes' if c['exchangeable'] else 'no'} | {r['flagged']} ({_pct(r['flagged_clean'])}) |")
    lines += ["", "What each printed, when no share:", ""]
    lines += [f"- {r['target']}: {r['statement']}" for r in rows if r["estimate"] is None]
    return "\n".join(lines) + "\n"


def oracle_markdown(rows: list[dict]) -> str:
    lines = ["Self-calibrated route with the oracle reference (the target's own pre-leak checkpoint):", "",
             "| target | truth | estimate | 95% CI | why no number |", "|---|---|---|---|---|"]
    for r in rows:
        ci = "–" if r["ci"][0] is None else f"{_pct(r['ci'][0])}–{_pct(r['ci'][1])}"
        lines.append(f"| {r['target']} | {_pct(r['truth'])} | {_pct(r['estimate'])} | {ci} | {r['why'] or ''} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--only", default="", help="comma-separated target names (default: all)")
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle-reference rows")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more setting for every card and audit, e.g. columns.advprompt=false (a card and "
                         "its audits must agree: use a fresh --output or targets whose cards it builds)")
    args = ap.parse_args()
    SETTINGS.extend(args.set)
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.protocols.simulate import load_tasks

    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config([AUDIT_DEFAULTS], SETTINGS, AuditConfig)
    tasks = load_tasks(cfg)
    names = [n for n in args.only.split(",") if n] if args.only else list(TARGETS)  # in the order asked
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    t0 = time.perf_counter()
    cards = {}
    rows, oracle_rows = [], []
    for name in names:
        spec = TARGETS[name]
        t = time.perf_counter()
        if spec[4] not in cards:
            cards[spec[4]] = build_card(spec[4], out)
        audited, extra = tasks, []
        if name.startswith("ctrl-"):
            audited, bench_file, control_file = control_split(tasks, out)
            extra = [f"benchmark.path={bench_file}", f"audit.control=humaneval-control={control_file}"]
        target = build_target(name, spec, cfg, audited, out)
        other = "tiny-alt" if spec[0] == "tiny" else "tiny"
        run_dir = audit(target, cards[spec[4]], out, reference=other, extra=extra, served=SERVED.get(name),
                        chat_style=CHAT.get(name))
        report = json.loads((run_dir / "report.json").read_text())
        report["run_dir"] = str(run_dir)
        rows.append(row(name, spec, target, report, len(audited), other))
        rows[-1]["seconds"] = round(time.perf_counter() - t, 1)
        print(json.dumps(rows[-1]), flush=True, file=sys.stderr)
        # the clean base is its own oracle; an endpoint without echo gives no log-probabilities to compare
        if not args.no_oracle and spec[1] not in ("none", "endpoint") and SERVED.get(name) is not no_echo \
                and name not in CHAT:
            sc = oracle_selfcal(run_dir, cfg, spec[0])
            truth = len(target["members"]) / len(audited)
            est = sc["estimate"] if sc["usable"] else None
            oracle_rows.append({"target": name, "truth": truth, "estimate": est, "ci": sc["ci"],
                                "fit_estimate": sc.get("estimate"), "why": sc.get("why_unusable")})
        (out / "matrix.json").write_text(json.dumps({"rows": rows, "oracle": oracle_rows}, indent=1))
        text = markdown(rows) + "\n" + control_markdown(rows) + "\n" + oracle_markdown(oracle_rows)
        (out / "matrix.md").write_text(text + f"\ntotal {time.perf_counter() - t0:.0f} s; settings {SETTINGS}\n")
    print(text)


if __name__ == "__main__":
    main()
