"""`leakray screen`: near-duplicate screening of benchmarks against a readable corpus (light to import)."""

from __future__ import annotations

import argparse
import sys

from leakray.commands import add_command


def _bench(spec: str) -> tuple[str, str]:
    """(name, file) from NAME=PATH, a file (named for its stem), or a benchmark leakray has a copy
    of (humaneval): the same specs `leakray benchmarks validate` and `leakray perturb` take. The
    screen needs the file itself, not only its tasks: it digests it and writes its cleaned copy."""
    import os

    name, sep, path = spec.partition("=")
    if sep and not os.path.exists(spec):
        if not name or not path:
            raise argparse.ArgumentTypeError(f"expected NAME=PATH, a file or a benchmark name, got {spec!r}")
        return name, path
    if os.path.isfile(spec):
        return os.path.basename(spec).split(".", 1)[0] or spec, spec
    from leakray.data.registry import READERS, benchmark_path
    from leakray.errors import BadInput

    if spec in READERS:
        try:
            return spec, benchmark_path(spec)
        except BadInput:
            raise argparse.ArgumentTypeError(f"benchmark {spec!r} has no packaged copy; give its file: "
                                             f"{spec}=PATH") from None
    raise argparse.ArgumentTypeError(f"{spec!r} is neither NAME=PATH, a file, nor a registered benchmark "
                                     f"({', '.join(sorted(READERS))})")


def _parts(spec: str) -> tuple[str, ...]:
    from leakray.screen.parts import PARTS

    parts = PARTS if spec == "all" else tuple(p.strip() for p in spec.split(",") if p.strip())
    if not parts or set(parts) - set(PARTS):
        raise argparse.ArgumentTypeError(f"expected 'all' or some of {','.join(PARTS)}, got {spec!r}")
    return parts


def add_arguments(p: argparse.ArgumentParser) -> None:
    from leakray.screen.parts import PARTS

    p.add_argument("--benchmark", action="append", type=_bench, required=True, metavar="NAME=PATH|FILE|NAME",
                   help="a benchmark: NAME=PATH (any format the readers accept), a file (named for its stem), "
                        "or the name of one leakray has a copy of (humaneval); repeat for several")
    p.add_argument("--corpus", required=True, metavar="PATH_OR_GLOB",
                   help="a directory (recursive), a file or a glob, local or a pyarrow filesystem URI "
                        "(s3://bucket/stack/**?endpoint_override=host:9000, gs://..., file:///...): code, text, "
                        "markdown, notebooks, JSON, JSONL, parquet/Arrow shards, any of them .gz/.zst/.bz2/.xz, "
                        "tar and zip archives member by member; other files are sniffed, and every file is "
                        "either screened or counted as skipped with its reason")
    p.add_argument("--output", required=True, metavar="DIR",
                   help="run directory: a path, or a pyarrow filesystem URI (s3://bucket/prefix, file:///...)")
    p.add_argument("--threshold", type=float, default=0.7, help="Jaccard threshold (default 0.7)")
    p.add_argument("--ngram", type=int, default=2, help="token n-gram size of the shingles (default 2)")
    p.add_argument("--num-perm", type=int, default=256, help="MinHash permutations (default 256)")
    p.add_argument("--containment", type=float, default=0.8,
                   help="containment threshold |sample ∩ file|/|sample| (default 0.8; 0 turns it off)")
    p.add_argument("--parts", type=_parts, default=PARTS, metavar="PART[,PART...]",
                   help=f"which parts of each sample are screened, any one matching is a leak: {', '.join(PARTS)} "
                        "or all (default: all)")
    p.add_argument("--column", action="append", default=[], metavar="NAME",
                   help="a parquet/Arrow column to screen; repeat for several (default: every string column "
                        "whose values look like text)")
    p.add_argument("--seed", type=int, default=1, help="seed of the MinHash permutations (default 1)")
    p.add_argument("--min-containment-shingles", type=int, default=16,
                   help="samples with fewer shingles are screened by Jaccard only (default 16)")
    p.add_argument("--min-shingles", type=int, default=8,
                   help="sample parts with fewer shingles are too generic to screen (default 8)")
    p.add_argument("--min-rare-shingles", type=int, default=4,
                   help="a pair shares at least this many shingles holding an uncommon token (tests of numbers: "
                        "this many of their token runs) (default 4)")
    p.add_argument("--span-tokens", type=int, default=8,
                   help="aligned verification of a containment hit: runs of at least this many tokens; tests "
                        "of numbers are matched on runs of twice this many (default 8)")
    p.add_argument("--span-coverage", type=float, default=0.5,
                   help="... must cover this share of the sample's tokens (default 0.5; 0 turns it off)")
    p.add_argument("--max-file-bytes", type=int, default=2 << 20,
                   help="larger code/text files and texts are skipped as huge (default 2 MiB)")
    p.add_argument("--max-parse-bytes", type=int, default=64 << 20,
                   help="larger JSON documents and notebooks are skipped as huge (default 64 MiB; JSONL streams)")
    p.add_argument("--engine", choices=("ray", "local"), default="ray", help="local: in-process, no Ray")
    p.add_argument("--workers", type=int, default=None, help="corpus actors (default: the cluster's CPUs)")
    p.add_argument("--address", default=None, help="Ray address, e.g. 'auto' for a cluster started with `ray start` (default: RAY_ADDRESS, else a "
                        "fresh local Ray)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray")
    p.add_argument("--force", action="store_true", help="recompute even if the run directory is complete")


def run(args: argparse.Namespace) -> int:
    from leakray.errors import BadInput
    from leakray.protocols.screen import run_screen
    from leakray.runs import output_root
    from leakray.screen.driver import closing_line
    from leakray.screen.index import ScreenConfig
    from leakray.storage import display, is_uri

    try:
        config = ScreenConfig(threshold=args.threshold, ngram=args.ngram, num_perm=args.num_perm, seed=args.seed,
                              containment=args.containment, parts=args.parts, columns=tuple(args.column),
                              min_shingles=args.min_shingles, min_rare_shingles=args.min_rare_shingles,
                              min_containment_shingles=args.min_containment_shingles,
                              span_tokens=args.span_tokens, span_coverage=args.span_coverage,
                              max_file_bytes=args.max_file_bytes, max_parse_bytes=args.max_parse_bytes)
        output = args.output if is_uri(args.output) else output_root(args.output)
        summary = run_screen(args.benchmark, args.corpus, output, config, engine=args.engine, workers=args.workers,
                             address=args.address, num_cpus=args.num_cpus, force=args.force)
    except (BadInput, ValueError) as exc:
        print(f"leakray screen: {exc}", file=sys.stderr)
        return 2
    print(closing_line(summary, display(output) if is_uri(output) else str(output)))
    return 0


def register(subparsers) -> None:
    add_command(subparsers, "screen", "near-duplicate screening of benchmarks against a corpus", __doc__,
                add_arguments, run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="leakray screen", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
