"""leakray: benchmark-leakage detection for code LLMs (screen a corpus, infer membership).

Each group of subcommands is a module of `leakray.commands` with `register(subparsers)`; modules
listed here must stay light to import (heavy imports go inside the command functions)."""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = (
    "leakray.commands.run",  # demo, simulate, audit, card
    "leakray.commands.execute",  # execute
    "leakray.commands.benchmarks",  # benchmarks validate
    "leakray.commands.screen",  # screen
    "leakray.commands.perturb",  # perturb
    "leakray.commands.sweep",  # sweep, sweep history, sweep diff
    "leakray.commands.compare",  # compare
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leakray", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # stage not built in this checkout
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from leakray.errors import BadInput, MissingExtra

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (BadInput, MissingExtra) as exc:  # refused input: one line, say where, no traceback
        print(f"leakray {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
