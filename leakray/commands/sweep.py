"""`leakray sweep SWEEP.yaml | history | diff A B`: scheduled sweeps and their history."""

from __future__ import annotations

import argparse
import json

FORMS = ("usage: leakray sweep SWEEP.yaml [--set K=V] [--quick] [--output DIR] [--address ADDR]\n"
         "       leakray sweep history [--catalog FILE | --output DIR] [--sweep S] [--model M] [--benchmark B]"
         " [--detector D] [--runs] [--json]\n"
         "       leakray sweep diff A B [--catalog FILE | --output DIR] [--json]   (A, B: sweep run ids, "
         "'latest', 'previous', or ISO times)")


def _catalog_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", help="the catalog file (default: <--output>/catalog.sqlite)")
    p.add_argument("--output", default="sweeps", help="a sweep output dir (default: sweeps)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from leakray.commands.run import QUICK

    run = argparse.ArgumentParser(prog="leakray sweep", description="run or resume a sweep")
    run.add_argument("spec", help="the sweep file (YAML)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override one value in every cell (after the sweep file's own)")
    run.add_argument("--quick", action="store_true", help="smoke-sized cells: " + " ".join(QUICK))
    run.add_argument("--output", help="sweep output dir (default: output_dir in the sweep file)")
    run.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    run.add_argument("--verbose", action="store_true")
    hist = argparse.ArgumentParser(prog="leakray sweep history", description="the catalog's rows, oldest first")
    _catalog_args(hist)
    for key in ("sweep", "model", "benchmark", "detector"):
        hist.add_argument(f"--{key}")
    hist.add_argument("--runs", action="store_true", help="list the sweep runs instead of the results")
    diff = argparse.ArgumentParser(prog="leakray sweep diff",
                                   description="newly flagged and cleared tasks between two sweep runs")
    _catalog_args(diff)
    diff.add_argument("a")
    diff.add_argument("b")
    return {"run": run, "history": hist, "diff": diff}


def _open(args):
    from pathlib import Path

    from leakray.runs import output_root
    from leakray.storage import RunStore, is_uri
    from leakray.protocols.sweep import catalog

    if args.catalog:
        path = Path(args.catalog)
    elif is_uri(args.output):  # the catalog of a sweep written to a URI: this node's copy of it
        path = catalog.catalog_path(RunStore(args.output, "", pull=(catalog.FILE,)).local)
    else:
        path = catalog.catalog_path(output_root(args.output))
    return catalog.connect(path, create=False)


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def _table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def cmd_history(args) -> int:
    from leakray.protocols.sweep import catalog

    con = _open(args)
    if args.runs:
        runs = [dict(r) for r in con.execute("SELECT id, sweep, started, finished, code_version, status "
                                              "FROM sweep_runs ORDER BY started")]
        print(json.dumps(runs, indent=1) if args.json else
              _table([list(r.values()) for r in runs], ["run", "sweep", "started", "finished", "code", "status"]))
        return 0
    rows = catalog.history(con, sweep=args.sweep, model=args.model, benchmark=args.benchmark, detector=args.detector)
    if args.json:
        print(json.dumps([{**dict(r), "flagged": json.loads(r["flagged"])} for r in rows], indent=1))
        return 0
    cols = ["time", "sweep_run", "model", "benchmark", "detector", *catalog.METRICS, "n", "n_flagged", "code_version"]
    print(_table([[r["time"][:19], *(r[c] for c in cols[1:])] for r in rows], cols))
    return 0


def cmd_diff(args) -> int:
    from leakray.protocols.sweep import catalog

    changes = catalog.diff(_open(args), args.a, args.b)
    if args.json:
        print(json.dumps(changes, indent=1))
        return 0
    for c in changes:
        where = f"{c['sweep']}: {c['model']} x {c['benchmark']} x {c['detector']}"
        if c["only"]:
            print(f"{where}: only in {args.a if c['only'] == 'a' else args.b}")
        if c["newly_flagged"] or c["cleared"] or not c["only"]:
            print(f"{where}: +{len(c['newly_flagged'])} newly flagged {c['newly_flagged']}, "
                  f"-{len(c['cleared'])} cleared {c['cleared']}")
    return 0


def cmd_run(args) -> int:
    from leakray.console import Console
    from leakray.commands.run import QUICK
    from leakray.protocols.sweep.runner import run_sweep

    extra = list(args.overrides) + ([f"ray.address={args.address}"] if args.address else [])
    result = run_sweep(args.spec, extra, QUICK if args.quick else [], args.output, Console(verbose=args.verbose))
    return 1 if result.failed else 0


def dispatch(args) -> int:
    parsers = _parsers()
    argv = [args.target, *args.rest]
    kind = args.target if args.target in ("history", "diff") else "run"
    sub = parsers[kind].parse_args(argv[1:] if kind != "run" else argv)
    return {"run": cmd_run, "history": cmd_history, "diff": cmd_diff}[kind](sub)


def register(sub) -> None:
    p = sub.add_parser("sweep", help="models x benchmarks x detectors, resumable, with a history catalog",
                       description="Run or resume a sweep, or read its history.\n" + FORMS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="SWEEP.yaml|history|diff")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=dispatch)
