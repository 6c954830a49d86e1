"""Starting or joining Ray: a job submitted to a cluster joins it, a laptop starts a local one."""

from __future__ import annotations

import os


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    kwargs = {"ignore_reinit_error": True, "log_to_driver": True}
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or os.environ["RAY_ADDRESS"], **kwargs)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
        # Ray Train's helper actors look the cluster up by address; with several local
        # instances on one machine (parallel test runs) auto-discovery is ambiguous.
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = True
