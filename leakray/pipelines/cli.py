"""`leakray demo` and `leakray simulate`: the simulated-leakage protocol end to end."""

from __future__ import annotations

import argparse

# A smoke-sized protocol: minutes, not a measurement (tests and first looks).
QUICK = [
    "benchmark.limit=24", "model.tiny.max_steps=30", "target.epochs=3", "shadow.epochs=3",
    "sample.k=2", "sample.max_new_tokens=48", "detect.seeds=[0]", "detect.cgmia.epochs=5",
]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", default=[], help="YAML merged over conf/default.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one value, e.g. --set target.epochs=15 (repeatable)")
    p.add_argument("--output", help="runs directory (default: output_dir in the config)")
    p.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--quick", action="store_true", help="smoke-sized protocol: " + " ".join(QUICK))


def run(args) -> int:
    import logging

    from leakray.config import load_config
    from leakray.pipelines.simulate import run_simulation

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    overrides = (QUICK if args.quick else []) + list(args.overrides)
    if args.output:
        overrides.append(f"output_dir={args.output}")
    if args.address:
        overrides.append(f"ray.address={args.address}")
    cfg = load_config(args.config, overrides)
    run_simulation(cfg)
    return 0


def register(sub) -> None:
    for name, help_ in (("demo", "offline demo: the CGMIA simulated-leakage protocol on HumanEval, local models"),
                        ("simulate", "the simulated-leakage protocol with a given config")):
        p = sub.add_parser(name, help=help_, description=help_)
        _add_common(p)
        p.set_defaults(func=run)
