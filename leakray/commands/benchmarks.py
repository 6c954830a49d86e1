"""`leakray benchmarks validate <name-or-path>`: every reference through the sandbox, and the
stop rule checked against it. Proves a reader's tasks are harness-ready, and that a model that
reproduced a reference verbatim would keep all of it and pass.

`leakray benchmarks copies <name-or-path>`: the pairs of tasks whose reference solutions nearly copy
each other (`screen/siblings.py`: Jaccard >= 0.7 of 5-token shingles); a model that saw one saw the
other. With `--against OTHER`: the tasks of OTHER (a private split, control tasks) that nearly copy
one of the benchmark's. Exit status 0 (pairs or none), 2 for unusable input.

Exit status: 0 when every reference passes and no task breaks the stop rule (failures listed
with `--allow-known` are reported but allowed), 1 otherwise, 2 for unusable input."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("benchmarks", help="benchmark files: validate references in the sandbox")
    bsub = p.add_subparsers(dest="benchmarks_command", required=True)
    v = bsub.add_parser("validate", help="run every reference solution against its tests; check the stop rule")
    v.add_argument("spec", help="a registered name (humaneval), a file (format sniffed), or NAME=PATH")
    v.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    # generous: ClassEval_35 needs 7 s alone and 20 s on a loaded machine; this checks data, not speed
    v.add_argument("--timeout", type=float, default=60.0, help="wall limit per run, seconds")
    v.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    v.add_argument("--allow-weak-isolation", action="store_true",
                   help="run references without bubblewrap (rlimits / unshare only)")
    v.add_argument("--allow-known", action="append", default=[], metavar="ID[,ID...]|FILE",
                   help="task ids of documented upstream defects (or a file of them, one per line, # comments): "
                        "listed but not failing the exit status; repeatable")
    v.set_defaults(func=validate)
    c = bsub.add_parser("copies", help="pairs of tasks whose solutions nearly copy each other (one leak, two ids)")
    c.add_argument("spec", help="a registered name (humaneval), a file (format sniffed), or NAME=PATH")
    c.add_argument("--threshold", type=float, default=None,
                   help="Jaccard of the solutions' token shingles (default 0.7, the screener's)")
    c.add_argument("--ngram", type=int, default=None,
                   help="tokens per shingle (default 5: at the screener's 2, short solutions that share their "
                        "language's idioms read as copies; screen/siblings.py)")
    c.add_argument("--against", metavar="SPEC",
                   help="instead, the tasks of SPEC (a private split, control tasks, a new benchmark) whose solution "
                        "nearly copies one of this benchmark's: each with its closest copy")
    c.add_argument("--output", help="also write the pairs here (.jsonl: one {a, b, jaccard} per line)")
    c.set_defaults(func=copies)


def allowed_ids(values: list[str]) -> set[str]:
    """Ids from `--allow-known` values: comma lists, or files with one id per line."""
    ids: set[str] = set()
    for value in values:
        if os.path.isfile(value):
            for line in Path(value).read_text(encoding="utf-8").splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    ids.add(line)
        else:  # ids contain '/' (MBJP/180), so a value that is no file is a list
            ids.update(part.strip() for part in value.split(",") if part.strip())
    return ids


def load_spec(spec: str) -> list[dict]:
    from leakray.data.registry import READERS, load_benchmark, load_benchmark_file, sniff_reader
    from leakray.errors import BadInput

    if "=" in spec and not os.path.exists(spec):
        name, path = spec.split("=", 1)
        return load_benchmark_file(name, path)
    if os.path.exists(spec):
        return load_benchmark(sniff_reader(spec), spec)
    if spec in READERS:
        try:
            return load_benchmark(spec)
        except TypeError as exc:  # a reader that needs a path
            raise BadInput(f"benchmark {spec!r} has no packaged data; give its file: {spec}=PATH") from exc
    raise BadInput(f"{spec!r} is neither a registered benchmark ({sorted(READERS)}) nor a file")


def validate(args) -> int:
    import time

    from leakray.data.tasks import continuation, program_of
    from leakray.errors import BadInput
    from leakray.models.stops import stop_rule_breaks, truncate
    from leakray.sandbox import Sandbox, SandboxConfig
    from leakray.schema import T, X

    try:
        tasks = load_spec(args.spec)
        allowed = allowed_ids(args.allow_known)
    except (BadInput, OSError) as exc:
        print(f"leakray benchmarks validate: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        tasks = tasks[:args.limit]
    problems: dict[str, list[str]] = {}  # task id -> what is wrong with it
    for t in tasks:
        for why in stop_rule_breaks(t[T.PROMPT], t[T.REFERENCE], t[T.LANGUAGE]):
            problems.setdefault(t[T.TASK_ID], []).append(f"stop rule: {why}")

    runnable = [t for t in tasks if t[T.TESTS].strip()]
    requests, programs = [], {}
    for t in runnable:
        base = {X.ID: t[T.TASK_ID], X.LANGUAGE: t[T.LANGUAGE], X.RUNNER: t[T.RUNNER], X.TESTS: t[T.TESTS]}
        requests.append({**base, X.PROGRAM: t[T.REFERENCE]})
        kept = truncate(t[T.PROMPT], continuation(t[T.PROMPT], t[T.REFERENCE]), t[T.LANGUAGE])
        program = program_of(t[T.PROMPT], kept)
        # the same text gives the same verdict; run only what a completion would change
        if program.rstrip() != t[T.REFERENCE].rstrip():
            programs[t[T.TASK_ID]] = {**base, X.ID: t[T.TASK_ID] + "#program", X.PROGRAM: program}
    sandbox = Sandbox(SandboxConfig(timeout_s=args.timeout, allow_weak_isolation=args.allow_weak_isolation))
    start = time.monotonic()
    results = sandbox.run_many(requests + list(programs.values()), workers=max(1, args.workers))
    elapsed = time.monotonic() - start
    refs, built = results[:len(requests)], {r[X.ID]: r for r in results[len(requests):]}
    failing = [r for r in refs if not r[X.PASSED]]
    for r in failing:
        last = r[X.STDERR_TAIL].strip().splitlines()[-1:] or [""]
        problems.setdefault(r[X.ID], []).append(f"reference {r[X.STATUS]}: {last[0][:160]}")
    for r in refs:
        prog = built.get(r[X.ID] + "#program")
        if r[X.PASSED] and prog is not None and not prog[X.PASSED]:
            last = prog[X.STDERR_TAIL].strip().splitlines()[-1:] or [""]
            problems.setdefault(r[X.ID], []).append(
                f"program_of(prompt, continuation) {prog[X.STATUS]} where the reference passes: {last[0][:160]}")

    names = sorted({t[T.BENCHMARK] for t in tasks})
    n, passed = len(refs), len(refs) - len(failing)
    print(f"{', '.join(names)}: {passed}/{n} references pass ({100.0 * passed / max(n, 1):.1f}%) "
          f"in {elapsed:.1f}s, isolation={sandbox.isolation}")
    if len(tasks) > n:
        print(f"  {len(tasks) - n} tasks have no tests (pass feature absent), not run")
    n_stop = sum(any(w.startswith("stop rule") for w in ws) for ws in problems.values())
    print(f"  stop rule: {len(tasks) - n_stop}/{len(tasks)} references survive it whole; "
          f"{len(programs)} programs differ from their reference text and were run too")
    blocking = sorted(tid for tid in problems if tid not in allowed)
    for tid in sorted(problems, key=lambda tid: (tid in allowed, tid)):
        tag = "KNOWN" if tid in allowed else "FAIL"
        for why in problems[tid]:
            print(f"  {tag} {tid}: {why}")
    unused = sorted((allowed - set(problems)) & {t[T.TASK_ID] for t in tasks})
    if unused:
        print(f"  allowed but fine now: {', '.join(unused)}")
    if blocking:
        print(f"  {len(blocking)} tasks fail ({len(problems) - len(blocking)} more are known defects)")
    return 1 if blocking else 0


def copies(args) -> int:
    import json
    from dataclasses import replace

    from leakray.errors import BadInput
    from leakray.screen.siblings import SIBLINGS, cross_near_copies, task_near_copies

    try:
        cfg = replace(SIBLINGS, **{k: v for k, v in (("threshold", args.threshold), ("ngram", args.ngram))
                                   if v is not None})
        tasks = load_spec(args.spec)
        others = load_spec(args.against) if args.against else None
    except (BadInput, OSError, ValueError) as exc:
        print(f"leakray benchmarks copies: {exc}", file=sys.stderr)
        return 2
    bar = f"solutions at Jaccard >= {cfg.threshold} of their {cfg.ngram}-token shingles"
    pairs = task_near_copies(tasks, cfg) if others is None else cross_near_copies(others, tasks, cfg)
    for a, b, j in pairs:
        print(f"{a}\t{b}\t{j:.3f}")
    if others is None:
        in_pairs = len({t for a, b, _ in pairs for t in (a, b)})
        print(f"{len(pairs)} pair{'' if len(pairs) == 1 else 's'} of near-copies among {len(tasks)} tasks "
              f"({in_pairs} tasks in a pair; {bar})", file=sys.stderr)
    else:
        print(f"{len(pairs)} of {len(others)} tasks of {args.against} nearly copy a task of {args.spec} ({bar})",
              file=sys.stderr)
    if args.output:
        Path(args.output).write_text("".join(json.dumps({"a": a, "b": b, "jaccard": j}) + "\n" for a, b, j in pairs))
    return 0
