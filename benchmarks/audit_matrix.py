"""The audit's validation matrix: `leakray audit` on targets whose truth this script knows, as a
user would run it (the target is a model path or an endpoint; the audit is not told the truth).

Targets (HumanEval, 164 tasks; members drawn by task with a seed the audit never sees):
- twin fine-tunes of the tiny base at 0 / 20 / 50% (15 epochs, the simulated-leak protocol's leak);
- the other local architecture: tiny targets audited with a `tiny-alt` card, and `tiny-alt`
  targets audited with the default `tiny` card, at 0 / 20%;
- pretraining mixtures (`leak.mode=pretrain-mix`): the tiny base continued on ~0.9M tokens of clean
  code with 25% of the tasks inserted 4 or 16 times;
- the clean tiny base served through the OpenAI-compatible endpoint backend (truth 0%);
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
    "altcard-tiny-0": ("tiny", "none", 0.0, 0, "tiny-alt"),
    "altcard-tiny-20": ("tiny", "finetune", 0.2, 0, "tiny-alt"),
    "alt-0": ("tiny-alt", "none", 0.0, 0, "tiny"),
    "alt-20": ("tiny-alt", "finetune", 0.2, 0, "tiny"),
    "mix-d4": ("tiny", "pretrain-mix", 0.25, 4, "tiny"),
    "mix-d16": ("tiny", "pretrain-mix", 0.25, 16, "tiny"),
    "endpoint-clean": ("tiny", "endpoint", 0.0, 0, "tiny"),
}
LOG = sys.stderr
MEMBER_SEED = 31  # not the audit's default seeds: the audit cannot know the members


def base_path(cfg, which: str) -> str:
    from leakray.config import to_stage
    from leakray.models.offline import ensure_base_model

    return str(ensure_base_model(to_stage(cfg.model.tiny if which == "tiny" else cfg.model.shadow_tiny))[0])


def build_target(name: str, spec: tuple, cfg, tasks: list[dict], out: Path) -> dict:
    """The target model (cached in out/targets/<key>) and its true members."""
    from leakray.config import to_stage
    from leakray.pipelines.audit import split_members
    from leakray.pipelines.simulate import training_text
    from leakray.runs import write_json_atomic
    from leakray.schema import T

    base, how, fraction, dose, _ = spec
    members = split_members([t[T.TASK_ID] for t in tasks], fraction, MEMBER_SEED)
    key = f"{base}-{how}-{fraction}-{dose}" if how not in ("none", "endpoint") else f"{base}-clean"
    model = out / "targets" / key
    texts = [training_text(t) for t in tasks if t[T.TASK_ID] in set(members)]
    if how in ("none", "endpoint"):
        return {"path": base_path(cfg, base), "members": [], "base": base}
    if not (model / "truth.json").exists():
        t0 = time.perf_counter()
        if how == "finetune":
            from leakray.models.finetune import finetune

            finetune(base_path(cfg, base), texts, to_stage(cfg.target), model, progress=False)
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
    from leakray.pipelines.audit import run_audit

    cfg = load_config([AUDIT_DEFAULTS], SETTINGS + [f"model.base={which}", f"output_dir={out / 'runs'}"], AuditConfig)
    return run_audit(cfg, Console(stream=LOG), card_only=True)


def audit(target: dict, spec: tuple, card: Path, out: Path, reference: str | None = None) -> dict:
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.console import Console
    from leakray.pipelines.audit import run_audit

    overrides = SETTINGS + [f"audit.card={card}", f"audit.target={target['path']}", f"output_dir={out / 'runs'}"]
    if reference:
        overrides.append(f"audit.reference_model={reference}")
    server = None
    if spec[1] == "endpoint":
        from leakray.models.endpoint_server import CompletionServer, HFBackend

        server = CompletionServer(HFBackend(target["path"], threads=1), lifetime_s=3600).start()
        overrides += ["sample.backend=openai", f"sample.endpoint_url={server.url}", "audit.target=tiny-served",
                      f"audit.reference_model={reference or 'tiny-alt'}"]
    try:
        cfg = load_config([AUDIT_DEFAULTS], overrides, AuditConfig)
        run_dir = run_audit(cfg, Console(stream=LOG))
    finally:
        if server is not None:
            server.stop()
    return json.loads((run_dir / "report.json").read_text())


def row(name: str, spec: tuple, target: dict, report: dict, n_tasks: int, reference: str) -> dict:
    s = report["summary"]
    truth = len(target["members"]) / n_tasks
    est, ci = s["leaked_fraction"]["estimate"], s["leaked_fraction"]["ci"]
    return {
        "target": name, "leak": spec[1], "dose": spec[3] or None, "card": spec[4], "target_base": spec[0],
        "reference": reference, "truth": truth, "estimate": est, "ci": ci,
        "error": None if est is None else est - truth,
        "covered": None if est is None else bool(ci[0] - 1e-9 <= truth <= ci[1] + 1e-9),
        "route": s["leaked_fraction"]["route"], "statement": s["leaked_fraction"].get("statement"),
        "primary": s.get("primary_detector"), "flagged": s["verdicts"]["suspected"],
        "uniform_p": (s.get("self_calibrated") or {}).get("uniformity", {}).get("ks_p"),
        "self_cal": (s.get("self_calibrated") or {}).get("estimate"),
        "card_route": (s.get("card_route") or {}).get("estimate"),
    }


def _pct(v) -> str:
    return "–" if v is None else f"{v:.1%}"


def markdown(rows: list[dict]) -> str:
    lines = ["| target | leak | card | reference | truth | estimate | 95% CI | error | covered | route | flagged | "
             "self-cal / card route | p uniform (KS p) |", "|" + "---|" * 13]
    for r in rows:
        est = _pct(r["estimate"]) if r["estimate"] is not None else f"not estimated: {r['statement']}"
        ci = "–" if r["estimate"] is None else f"{_pct(r['ci'][0])}–{_pct(r['ci'][1])}"
        err = "–" if r["error"] is None else f"{r['error'] * 100:+.1f} pts"
        lines.append(f"| {r['target']} | {r['leak']}{'' if not r['dose'] else ' x' + str(r['dose'])} | {r['card']} | "
                     f"{r['reference']} | {_pct(r['truth'])} | {est} | {ci} | {err} | "
                     f"{'–' if r['covered'] is None else ('yes' if r['covered'] else 'NO')} | {r['route']} | "
                     f"{r['flagged']} | {_pct(r['self_cal'])} / {_pct(r['card_route'])} | "
                     f"{'–' if r['uniform_p'] is None else format(r['uniform_p'], '.3f')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--only", default="", help="comma-separated target names (default: all)")
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle-reference rows")
    args = ap.parse_args()
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.pipelines.simulate import load_tasks

    out = Path(args.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config([AUDIT_DEFAULTS], SETTINGS, AuditConfig)
    tasks = load_tasks(cfg)
    names = [n for n in TARGETS if not args.only or n in args.only.split(",")]
    t0 = time.perf_counter()
    cards = {}
    rows = []
    for name in names:
        spec = TARGETS[name]
        t = time.perf_counter()
        if spec[4] not in cards:
            cards[spec[4]] = build_card(spec[4], out)
        target = build_target(name, spec, cfg, tasks, out)
        other = "tiny-alt" if spec[0] == "tiny" else "tiny"
        refs = [other] + ([] if args.no_oracle else [spec[0]])
        for ref in refs:
            report = audit(target, spec, cards[spec[4]], out, reference=ref)
            rows.append(row(name, spec, target, report, len(tasks), "oracle" if ref == spec[0] else ref))
            print(json.dumps(rows[-1]), f"{time.perf_counter() - t:.0f}s", flush=True, file=sys.stderr)
        (out / "matrix.json").write_text(json.dumps(rows, indent=1))
        (out / "matrix.md").write_text(markdown(rows) + f"\ntotal {time.perf_counter() - t0:.0f} s; settings "
                                       f"{SETTINGS}\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
