"""`leakray screen`: near-duplicate screening of benchmarks against a readable corpus (light to import)."""

from __future__ import annotations

import argparse
import sys


def _bench(spec: str) -> tuple[str, str]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {spec!r}")
    return name, path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--benchmark", action="append", type=_bench, required=True, metavar="NAME=PATH",
                   help="a benchmark file (any format the readers accept); repeat for several")
    p.add_argument("--corpus", required=True, metavar="PATH_OR_GLOB",
                   help="a directory of source files (recursive), or JSONL/parquet shards with a 'content' column")
    p.add_argument("--output", required=True, metavar="DIR",
                   help="run directory: a path, or a pyarrow filesystem URI (s3://bucket/prefix, file:///...)")
    p.add_argument("--threshold", type=float, default=0.7, help="Jaccard threshold (default 0.7)")
    p.add_argument("--ngram", type=int, default=2, help="token n-gram size of the shingles (default 2)")
    p.add_argument("--num-perm", type=int, default=256, help="MinHash permutations (default 256)")
    p.add_argument("--containment", type=float, default=0.8,
                   help="containment threshold |sample ∩ file|/|sample| (default 0.8; 0 turns it off)")
    p.add_argument("--field", choices=("reference", "prompt", "both"), default="reference",
                   help="which text of each sample is screened (default: the reference solution)")
    p.add_argument("--seed", type=int, default=1, help="seed of the MinHash permutations (default 1)")
    p.add_argument("--min-containment-shingles", type=int, default=16,
                   help="samples with fewer shingles are screened by Jaccard only (default 16)")
    p.add_argument("--max-file-bytes", type=int, default=2 << 20, help="larger corpus files are skipped as huge")
    p.add_argument("--engine", choices=("ray", "local"), default="ray", help="local: in-process, no Ray")
    p.add_argument("--workers", type=int, default=None, help="corpus actors (default: the cluster's CPUs)")
    p.add_argument("--address", default=None, help="Ray address, e.g. 'auto' for a cluster started with `ray start` (default: RAY_ADDRESS, else a "
                        "fresh local Ray)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray")
    p.add_argument("--force", action="store_true", help="recompute even if the run directory is complete")


def run(args: argparse.Namespace) -> int:
    from leakray.errors import BadInput
    from leakray.pipelines.screen import run_screen
    from leakray.runs import output_root
    from leakray.screen.index import ScreenConfig
    from leakray.storage import display, is_uri

    try:
        config = ScreenConfig(threshold=args.threshold, ngram=args.ngram, num_perm=args.num_perm, seed=args.seed,
                              containment=args.containment, field=args.field,
                              min_containment_shingles=args.min_containment_shingles,
                              max_file_bytes=args.max_file_bytes)
        output = args.output if is_uri(args.output) else output_root(args.output)
        run_screen(args.benchmark, args.corpus, output, config, engine=args.engine, workers=args.workers,
                   address=args.address, num_cpus=args.num_cpus, force=args.force)
    except (BadInput, ValueError) as exc:
        print(f"leakray screen: {exc}", file=sys.stderr)
        return 2
    print(f"leakray screen: outputs in {display(output) if is_uri(output) else output}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("screen", help="near-duplicate screening of benchmarks against a corpus",
                              description=__doc__.splitlines()[0])
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="leakray screen", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
