"""`leakray demo` and `leakray simulate`: the simulated-leakage protocol end to end."""

from __future__ import annotations

import argparse

# A smoke-sized protocol: minutes, not a measurement (tests and first looks).
QUICK = [
    "benchmark.limit=24", "model.tiny.max_steps=30", "target.epochs=3", "shadow.epochs=3",
    "sample.k=2", "sample.max_new_tokens=48", "detect.seeds=[0]", "detect.cgmia.epochs=5",
]


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", default=[], help="YAML merged over the packaged defaults")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one value, e.g. --set target.epochs=15 (repeatable)")
    p.add_argument("--output", help="runs directory (default: output_dir in the config)")
    p.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--verbose", action="store_true", help="show Ray's and the workers' logs on the console")


def config_from_args(args, extra: list[str] = ()):
    """The typed, validated config (or one BadInput line) from --config/--set/--output/--address."""
    from leakray.config import load_config

    overrides = list(extra) + list(args.overrides)
    if args.output:
        overrides.append(f"output_dir={args.output}")
    if args.address:
        overrides.append(f"ray.address={args.address}")
    return load_config(args.config, overrides)


def run(args) -> int:
    from leakray.console import Console
    from leakray.pipelines.simulate import run_simulation

    cfg = config_from_args(args, QUICK if args.quick else [])  # validated before any stage
    run_simulation(cfg, Console(verbose=args.verbose))
    return 0


def register(sub) -> None:
    for name, help_ in (("demo", "offline demo: the CGMIA simulated-leakage protocol on HumanEval, local models"),
                        ("simulate", "the simulated-leakage protocol with a given config")):
        p = sub.add_parser(name, help=help_, description=help_)
        add_config_args(p)
        p.add_argument("--quick", action="store_true", help="smoke-sized protocol: " + " ".join(QUICK))
        p.set_defaults(func=run)
