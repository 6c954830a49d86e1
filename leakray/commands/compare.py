"""`leakray compare RUN_DIR...`: paper-style tables and statistics over many benchmarks' simulate runs."""

from __future__ import annotations

import argparse

from leakray.commands import add_command

DEFAULT_METRICS = "auc,tpr_at_5fpr,tpr_at_1fpr,mcc,precision,recall"  # = leakray.report.compare.METRICS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", metavar="RUN_DIR",
                   help="simulate run dirs, or dirs holding them one/two levels down (multi-benchmark runs)")
    p.add_argument("--output", default="compare", help="where the tables go (default: ./compare)")
    p.add_argument("--metrics", default=DEFAULT_METRICS, help=f"comma-separated (default: {DEFAULT_METRICS})")
    p.add_argument("--reference", default="cgmia",
                   help="the detector compared against every other one (default: cgmia)")
    p.add_argument("--detectors", help="comma-separated subset of detectors to show (the reference always is)")
    p.add_argument("--draw-tol", type=float, default=0.005,
                   help="|reference - detector| at or below this is a draw (default: 0.005)")
    p.add_argument("--alpha", type=float, default=0.05, help="level for the BH-adjusted p (default: 0.05)")
    p.add_argument("--no-plots", action="store_true", help="tables only, no PNGs")


def _split(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def run(args) -> int:
    import sys

    from leakray.report.compare import compare

    result = compare(args.dirs, args.output, metrics=tuple(_split(args.metrics)), reference=args.reference,
                     detectors=_split(args.detectors) or None, draw_tol=args.draw_tol, alpha=args.alpha,
                     plots=not args.no_plots)
    for note in result["notes"]:
        print(f"leakray compare: note: {note}", file=sys.stderr)
    print(f"leakray compare: {result['n_benchmarks']} benchmark(s) x {len(result['detectors'])} detectors, "
          f"reference {result['reference']} -> {args.output}/compare.md")
    return 0


def register(subparsers) -> None:
    add_command(subparsers, "compare", "paper-style tables and statistics over many benchmarks' runs", __doc__,
                add_arguments, run)
