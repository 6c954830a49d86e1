"""Starting or joining Ray: a job submitted to a cluster joins it, a laptop starts a local one.

Quiet by default: workers' output stays in Ray's log files (linked from the run's `logs/`),
Ray Data shows one overall progress bar, not one per operator."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

# The address of the local instance ensure_ray started (exported as RAY_ADDRESS for Ray Train's
# helper actors). Once that instance is shut down the variable is stale, not a cluster to join.
_OWN_ADDRESS: str | None = None


def ensure_ray(address: str | None = None, num_cpus: int | None = None, *, verbose: bool = True,
               log_dir: Path | None = None) -> None:
    import ray

    global _OWN_ADDRESS
    if not ray.is_initialized():
        if _OWN_ADDRESS is not None and os.environ.get("RAY_ADDRESS") == _OWN_ADDRESS:
            del os.environ["RAY_ADDRESS"]
        kwargs = {"ignore_reinit_error": True, "log_to_driver": verbose,
                  "logging_level": logging.INFO if verbose else logging.WARNING}
        if address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=address or os.environ["RAY_ADDRESS"], **kwargs)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
            # Ray Train's helper actors look the cluster up by address; with several local
            # instances on one machine (parallel test runs) auto-discovery is ambiguous.
            os.environ["RAY_ADDRESS"] = _OWN_ADDRESS = ray.get_runtime_context().gcs_address
    from ray.data import DataContext

    ctx = DataContext.get_current()
    no_progress_guard_off(ctx)
    ctx.enable_progress_bars = True
    ctx.enable_operator_progress_bars = verbose
    ctx.print_on_execution_start = verbose
    ctx.execution_options.verbose_progress = verbose
    if not verbose:
        for name in ("ray", "ray.data", "ray.train", "ray.tune"):
            for h in logging.getLogger(name).handlers:
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    h.setLevel(logging.WARNING)
    if log_dir is not None:
        _link_session_logs(Path(log_dir))


# Ray Data's own variable: where it is set, its value stands
NO_PROGRESS_ENV = "RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S"


def no_progress_guard_off(ctx) -> None:
    """Ray Data (2.60 here) fails an execution in which no operator takes an output for 30 minutes,
    and with it every batch the stage had finished. One batch can take longer and still be
    working: 8 tasks through a rate-limited API or a large model on a slow device (measured: a
    collection through the matrix's endpoint, four batches in flight on one served model, was
    failed after 1800 s with every batch still being answered). Each step bounds its own time
    (request timeouts and retries, sandbox limits, `max_new_tokens`), so the guard is off here,
    unless the user sets Ray's variable for it."""
    if NO_PROGRESS_ENV not in os.environ:
        ctx.execution_no_progress_timeout_s = -1


def run_task(fn, *args, engine: str = "local", num_gpus: float = 0, num_cpus: float = 1):
    """``fn(*args)`` here, or as one Ray task with the given resources (e.g. a GPU the driver lacks)."""
    if engine == "local":
        return fn(*args)
    import ray

    if not ray.is_initialized():
        ensure_ray(verbose=False)

    return ray.get(ray.remote(num_gpus=num_gpus, num_cpus=num_cpus)(fn).remote(*args))


def submit_tasks(fn, items: list, *shared, engine: str = "local", num_cpus: float = 1,
                 env: dict | None = None, on_done=None):
    """``[fn(item, *shared) for item in items]`` as one Ray task per item running side by side
    (the shared arguments go through the object store once), in two halves: the tasks start now,
    in the order given (put the longest first), and the function returned waits for their
    results, in order, so the caller can do its own work in between (a Ray Train run fitting
    beside the tasks). With ``engine="local"`` the work runs here when the results are asked
    for. ``env``: variables the tasks need that a cluster's workers were not started with
    (plug-in detectors). ``on_done()``: called once per item as it finishes, in the order they
    finish (a stage's progress count, `progress.JobTally`)."""
    tell = on_done or (lambda: None)
    if engine == "local" or not items:
        def run_here() -> list:
            out = []
            for item in items:
                out.append(fn(item, *shared))
                tell()
            return out
        return run_here
    import ray

    if not ray.is_initialized():  # not Ray's implicit init on the first .remote(): ours is quiet and known
        ensure_ray(verbose=False)

    refs = [ray.put(x) for x in shared]
    opts = {"num_cpus": num_cpus, **({"runtime_env": {"env_vars": env}} if env else {})}
    task = ray.remote(**opts)(fn)
    pending = [task.remote(item, *refs) for item in items]
    # counted as they finish, from now on (the caller may work for minutes before it gathers)
    counting = threading.Thread(target=_count_finished, args=(list(pending), tell), name="tasks-finished",
                                daemon=True) if on_done else None
    if counting is not None:
        counting.start()

    def gather() -> list:
        out = ray.get(pending)  # in the order given
        if counting is not None:
            counting.join()
        return out
    return gather


def _count_finished(refs: list, tell) -> None:
    """``tell()`` once per task of ``refs`` as it finishes (failed ones too: ``ray.get`` raises theirs)."""
    import ray

    while refs:
        ready, refs = ray.wait(refs, num_returns=1)
        for _ in ready:
            tell()


def import_train_and_tune() -> None:
    """Import Ray Train and Ray Tune here, once, before threads start runs of both: two threads
    importing them at the same time meet in a half-initialised module (ImportError: circular
    import, seen with Ray 2.60)."""
    import ray.train.torch  # noqa: F401
    import ray.tune  # noqa: F401


def _link_session_logs(log_dir: Path) -> None:
    """`<run>/logs/ray` -> this Ray session's log directory (workers' stdout/stderr live there)."""
    try:
        from ray._private.worker import _global_node

        target = _global_node.get_logs_dir_path() if _global_node is not None else None
    except Exception:  # a private API: losing the link must not stop a run
        target = None
    if not target:
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    link = log_dir / "ray"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target, target_is_directory=True)


def shutdown_ray() -> None:
    """Shut this process's Ray down and forget the address ensure_ray exported for it (a child
    process started later must not try to join a cluster that is gone)."""
    import ray

    global _OWN_ADDRESS
    ray.shutdown()
    if _OWN_ADDRESS is not None and os.environ.get("RAY_ADDRESS") == _OWN_ADDRESS:
        del os.environ["RAY_ADDRESS"]
    _OWN_ADDRESS = None
