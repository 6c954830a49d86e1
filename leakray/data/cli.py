"""`leakray benchmarks validate <name-or-path>`: every reference through the sandbox, pass rate
and the failing ids with their status. Proves a reader's tasks are harness-ready."""

from __future__ import annotations

import os
import sys


def register(sub) -> None:
    p = sub.add_parser("benchmarks", help="benchmark files: validate references in the sandbox")
    bsub = p.add_subparsers(dest="benchmarks_command", required=True)
    v = bsub.add_parser("validate", help="run every reference solution against its tests")
    v.add_argument("spec", help="a registered name (humaneval), a file (format sniffed), or NAME=PATH")
    v.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    # generous: ClassEval_35 needs 7 s alone and 20 s on a loaded machine; this checks data, not speed
    v.add_argument("--timeout", type=float, default=60.0, help="wall limit per run, seconds")
    v.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    v.set_defaults(func=validate)


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

    from leakray.errors import BadInput
    from leakray.sandbox import Sandbox, SandboxConfig
    from leakray.schema import T, X

    try:
        tasks = load_spec(args.spec)
    except BadInput as exc:
        print(f"leakray benchmarks validate: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        tasks = tasks[:args.limit]
    runnable = [t for t in tasks if t[T.TESTS].strip()]
    sandbox = Sandbox(SandboxConfig(timeout_s=args.timeout))
    requests = [{X.ID: t[T.TASK_ID], X.LANGUAGE: t[T.LANGUAGE], X.RUNNER: t[T.RUNNER],
                 X.PROGRAM: t[T.REFERENCE], X.TESTS: t[T.TESTS]} for t in runnable]
    start = time.monotonic()
    results = sandbox.run_many(requests, workers=max(1, args.workers))
    elapsed = time.monotonic() - start
    failing = [r for r in results if not r[X.PASSED]]
    names = sorted({t[T.BENCHMARK] for t in tasks})
    n, passed = len(results), len(results) - len(failing)
    print(f"{', '.join(names)}: {passed}/{n} references pass ({100.0 * passed / max(n, 1):.1f}%) "
          f"in {elapsed:.1f}s, isolation={sandbox.isolation}")
    if len(tasks) > n:
        print(f"  {len(tasks) - n} tasks have no tests (pass feature absent), not run")
    for r in failing:
        last = r[X.STDERR_TAIL].strip().splitlines()[-1:] or [""]
        print(f"  FAIL {r[X.ID]}: {r[X.STATUS]}  {last[0][:160]}")
    return 0
