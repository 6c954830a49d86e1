"""What every protocol does around its stages: a content-addressed run directory (staged here,
mirrored to a URI when the output is one) with its config and logs, then a `StageRunner` that
starts (or joins) Ray before the first stage it has to run. A protocol is then only its list of
`StageSpec`s."""

from __future__ import annotations

from leakray.console import Console, setup_logging
from leakray.runs import StageRunner, write_json_atomic
from leakray.storage import RunStore


def open_run(cfg, name: str, n_tasks: int, console: Console, label: str = "run directory") -> RunStore:
    """``<output_dir>/<name>``: config.json and logs/ written, the location said once."""
    store = RunStore(cfg.output_dir, name)
    run_dir = store.local
    write_json_atomic(run_dir / "config.json", cfg.model_dump())
    log_file = setup_logging(run_dir / "logs", console.verbose)
    console.say(f"{label} {store.location} ({n_tasks} tasks; logs in {log_file.relative_to(run_dir)})"
                + (f"; staged in {run_dir}" if store.mirrored else ""))
    return store


def broken_references_line(tasks: list[dict]) -> str | None:
    """A warning, said before any stage, when some Python references do not compile as the program
    a completion makes (`data.tasks.references_that_do_not_compile`); None when all do. A benchmark
    of one's own whose prompt is plain text ran to the end with every program failing to compile
    and nothing said."""
    from leakray.data.tasks import references_that_do_not_compile

    bad = references_that_do_not_compile(tasks)
    if not bad:
        return None
    (task_id, error), more = bad[0], len(bad) - 1
    return (f"{len(bad)} of {len(tasks)} references do not compile as the program a completion makes (the "
            f"prompt, then the rest of the reference): {task_id}: {error}" + (f", and {more} more" if more else "")
            + "; their completions cannot compile either. A prompt must be the program's beginning (text in a "
            "docstring or comment); `leakray benchmarks validate NAME=PATH` runs every reference against its tests")


def stage_runner(cfg, store: RunStore, console: Console) -> StageRunner:
    """The run's stages on Ray (a submitted job joins its cluster, a laptop starts a local one),
    joined when the first stage that is not done yet starts: an invocation that finds the run
    finished (to write its report again) starts no cluster, and leaves `logs/ray` pointing at
    the session whose workers ran the stages."""
    from leakray.executor.runtime import ensure_ray

    def join() -> None:
        ensure_ray(cfg.ray.address, verbose=console.verbose, log_dir=store.local / "logs")

    # a finished stage of another run in the same output directory, made from the same inputs, is
    # adopted rather than run again (runs.StageSpec.key), unless the run asks for every stage anew
    return StageRunner(store.local, console, store, before_work=join, reuse=getattr(cfg, "reuse_stages", True))


def time_line(ran_now: dict[str, dict], total_s: float, machine: dict | None = None, top: int = 3) -> str:
    """Where this invocation's time went: its total, the slowest stages it ran (a resumed stage
    cost nothing now and is left out), the slowest parts inside them, and how busy this machine's
    CPUs were over it (``machine``: `runs.machine_use`): near 100%, only less work or more CPUs
    makes the run shorter; idle CPUs mean it waited."""
    ran = sorted(((i.get("seconds") or 0.0, name) for name, i in ran_now.items()), reverse=True)
    slow = ", ".join(f"{name} {s:.0f} s" for s, name in ran[:top])
    # inside the stages: each part's busy time (summed over workers, so parts overlap; `leakray.parts`)
    parts = sorted(((s, f"{name}/{part}") for name, i in ran_now.items()
                    for part, s in (i.get("part_seconds") or {}).items() if s), reverse=True)
    busy = ", ".join(f"{name} {s:.0f} s" for s, name in parts[:top])
    cpus = (f"; this machine's {machine['cpus']} CPUs were {machine['busy_share']:.0%} busy"
            if machine and ran else "")
    return (f"total {total_s:.0f} s" + (f"; slowest: {slow}" if slow else " (every stage was already done)")
            + (f"; slowest parts (busy time): {busy}" if busy else "") + cpus)
