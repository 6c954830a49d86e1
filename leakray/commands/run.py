"""`leakray demo` and `leakray simulate`: the simulated-leakage protocol end to end."""

from __future__ import annotations

import argparse
import sys

# A smoke-sized protocol: minutes, not a measurement (tests and first looks).
QUICK = [
    # the base is the default one: it ships prebuilt (leakray.models.prebuilt), so a smoke run no longer
    # trains a 30-step stand-in (which, never ending a function, also made every generation run to its cap)
    "benchmark.limit=24", "target.epochs=3", "shadow.epochs=3",
    "sample.k=2", "sample.max_new_tokens=48", "detect.seeds=[0]", "detect.cgmia.epochs=5",
]


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", default=[], help="YAML merged over the packaged defaults")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one value, e.g. --set target.epochs=15 (repeatable)")
    p.add_argument("--output", help="runs directory: a path or a pyarrow filesystem URI (s3://bucket/prefix, gs://..., "
                   "file:///...); default: output_dir in the config")
    p.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--verbose", action="store_true", help="show Ray's and the workers' logs on the console")
    p.add_argument("--no-reuse", action="store_true",
                   help="run every stage of a new run, adopting none that another run in the output directory "
                        "finished from the same inputs (default: adopt them)")


def config_from_args(args, extra: list[str] = ()):
    """The typed, validated config (or one BadInput line) from --config/--set/--output/--address."""
    from leakray.config import load_config

    overrides = list(extra) + list(args.overrides)
    if args.output:
        overrides.append(f"output_dir={args.output}")
    if args.address:
        overrides.append(f"ray.address={args.address}")
    if getattr(args, "no_reuse", False):
        overrides.append("reuse_stages=false")
    return load_config(args.config, overrides)


def run(args) -> int:
    from leakray.console import Console
    from leakray.protocols.simulate import run_simulation

    cfg = config_from_args(args, QUICK if args.quick else [])  # validated before any stage
    run_simulation(cfg, Console(verbose=args.verbose))
    return 0


# smoke-sized audit (tests and first looks): enough tasks for a shadow half and its validation half
AUDIT_QUICK = [
    # the shadow's base and the reference model (the other local architecture) are the prebuilt
    # defaults (leakray/prebuilt): copied, not trained
    "benchmark.limit=32", "target.epochs=3", "shadow.epochs=3",
    "sample.k=2", "sample.max_new_tokens=48", "detect.cgmia.epochs=5", "audit.bootstrap=200",
]


def audit_overrides(args) -> list[str]:
    """The audit's named flags as config overrides (they win over --set)."""
    out = []
    if getattr(args, "target", None):
        out.append(f"audit.target={args.target}")
    if args.benchmark:
        name, _, path = args.benchmark.partition("=")
        out += [f"benchmark.name={name}", f"benchmark.path={path or 'null'}"]
    if args.shadow_base:
        out.append(f"model.base={args.shadow_base}")
    if getattr(args, "planted_base", None):
        out.append(f"audit.planted_base={args.planted_base}")
    if getattr(args, "reference_model", None):
        out.append(f"audit.reference_model={args.reference_model}")
    if getattr(args, "card", None):
        out.append(f"audit.card={args.card}")
    if getattr(args, "corpus", None):
        out.append(f"audit.corpus={args.corpus}")
    if getattr(args, "control", None):
        out.append(f"audit.control={args.control}")
    return out


def run_audit_cmd(args, card_only: bool = False) -> int:
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.console import Console
    from leakray.protocols.audit import run_audit

    overrides = (AUDIT_QUICK if args.quick else []) + list(args.overrides) + audit_overrides(args)
    if args.output:
        overrides.append(f"output_dir={args.output}")
    if args.address:
        overrides.append(f"ray.address={args.address}")
    if args.no_reuse:
        overrides.append("reuse_stages=false")
    cfg = load_config([AUDIT_DEFAULTS, *args.config], overrides, AuditConfig)
    if getattr(args, "plan", False):  # count what the audit would ask of its target; run nothing
        from leakray.protocols.audit_plan import audit_requests, plan_lines
        from leakray.protocols.engine import broken_references_line
        from leakray.protocols.simulate import load_tasks

        tasks = load_tasks(cfg)
        if warning := broken_references_line(tasks):  # on stderr: the plan's own lines stay on stdout
            print(f"[leakray] WARNING: {warning}", file=sys.stderr)
        print("\n".join(plan_lines(cfg, audit_requests(cfg, tasks))))
        return 0
    run_audit(cfg, Console(verbose=args.verbose), card_only=card_only)
    return 0


def register(sub) -> None:
    p = sub.add_parser("audit", help="has this model seen my benchmark: which samples, how much leaked, the inflation",
                       description="Audit a model (default: a tiny model with a planted leak, so the answer can be "
                                   "checked offline). Defaults: leakray/conf/audit.yaml over default.yaml.")
    add_config_args(p)
    p.add_argument("--target", help="model under audit: HF id, local path, or an endpoint's model name "
                                    "(with --set sample.backend=openai); default: planted")
    p.add_argument("--benchmark", metavar="NAME[=PATH]", help="a benchmark reader and its file (default: humaneval), or a label of your own and its "
                        "file: any reader's format, or leakray's task format (task_id, prompt, reference; tests, "
                        "language, entry_point optional)")
    p.add_argument("--shadow-base", help="base model of the shadow (default: the local tiny model)")
    p.add_argument("--planted-base", help="base of the planted target when it differs from the shadow's "
                                          "(tiny, tiny-alt, an HF id or path)")
    p.add_argument("--reference-model", help="reference model, not the target's own checkpoint (default: auto)")
    p.add_argument("--card", help="reuse a detector card (leakray card build): no shadow fine-tuning")
    p.add_argument("--corpus", help="screen the benchmark against this corpus (a path, glob or filesystem URI, as "
                                            "for leakray screen) and fuse the evidence")
    p.add_argument("--control", metavar="NAME[=PATH]",
                   help="tasks of the benchmark's kind the target cannot have seen (written after its cutoff, a "
                        "private split): the control route measures the null on them")
    p.add_argument("--quick", action="store_true", help="smoke-sized audit: " + " ".join(AUDIT_QUICK))
    p.add_argument("--plan", action="store_true",
                   help="print what the audit would ask of the target (requests, choices, tokens, prompt characters, "
                        "per part) and exit: nothing is run or sent")
    p.set_defaults(func=run_audit_cmd)

    card = sub.add_parser("card", help="detector cards: fitted detectors + calibration, reusable across audits")
    card_sub = card.add_subparsers(dest="card_command", required=True)
    b = card_sub.add_parser("build", help="fine-tune a shadow, fit and calibrate every detector, save the card")
    add_config_args(b)
    b.add_argument("--benchmark", metavar="NAME[=PATH]", help="a benchmark reader and its file (default: humaneval), or a label of your own and its "
                        "file: any reader's format, or leakray's task format (task_id, prompt, reference; tests, "
                        "language, entry_point optional)")
    b.add_argument("--shadow-base", help="base model of the shadow (default: the local tiny model)")
    b.add_argument("--quick", action="store_true", help="smoke-sized: " + " ".join(AUDIT_QUICK))
    b.set_defaults(func=lambda args: run_audit_cmd(args, card_only=True))

    for name, help_ in (("demo", "offline demo: the CGMIA simulated-leakage protocol on HumanEval, local models"),
                        ("simulate", "the simulated-leakage protocol with a given config")):
        p = sub.add_parser(name, help=help_, description=help_)
        add_config_args(p)
        p.add_argument("--quick", action="store_true", help="smoke-sized protocol: " + " ".join(QUICK))
        p.set_defaults(func=run)
