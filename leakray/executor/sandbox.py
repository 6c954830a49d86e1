"""The execute stage on Ray Data: an actor pool of sandboxes, each running several programs at once.

Actor-pool tasks retry at least once, so a batch may run twice; every result carries its
request's X.ID and consumers key by it."""

from __future__ import annotations

import math

import numpy as np

from leakray.schema import X

REQUEST_COLUMNS = (X.ID, X.LANGUAGE, X.RUNNER, X.PROGRAM, X.TESTS, X.TIMEOUT_S)
RESULT_COLUMNS = (X.ID, X.STATUS, X.PASSED, X.DURATION_S, X.STDOUT_TAIL, X.STDERR_TAIL)


def _plain(value):
    """numpy scalars -> Python; NaN/None (an absent optional field) -> None."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


class SandboxActor:
    """`ds.map_batches(SandboxActor, compute=ActorPoolStrategy(...), batch_format="numpy")`."""

    def __init__(self, config: dict | None = None, threads: int = 4):
        from leakray.sandbox import Sandbox

        self.sandbox = Sandbox(config)
        self.threads = threads

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch[X.ID])
        requests = []
        for i in range(n):
            req = {}
            for col in REQUEST_COLUMNS:
                if col in batch:
                    value = _plain(batch[col][i])
                    if value is not None and not (col == X.RUNNER and value == ""):  # "" runner: default
                        req[col] = value
            requests.append(req)
        results = self.sandbox.run_many(requests, workers=self.threads)
        out = {col: np.array([r[col] for r in results], dtype=object) for col in RESULT_COLUMNS}
        out[X.PASSED] = out[X.PASSED].astype(bool)
        out[X.DURATION_S] = out[X.DURATION_S].astype(np.float64)
        return out


def execute_dataset(ds, *, config=None, actors: int = 1, threads: int = 4):
    """Requests in (X request columns), results out (X result columns), any order."""
    import ray

    if config is not None and not isinstance(config, dict):
        config = config.to_dict()
    return ds.map_batches(
        SandboxActor, fn_constructor_kwargs={"config": config, "threads": threads},
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(1, actors)),
        batch_format="numpy", batch_size=max(1, threads) * 4, num_cpus=1,
    )
