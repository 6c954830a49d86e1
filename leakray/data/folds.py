"""Seeded splits by task: never by row, so one task never lands on both sides."""

from __future__ import annotations

import numpy as np

from leakray.schema import T


def assign_folds(tasks: list[dict], n_folds: int = 4, seed: int = 0) -> dict[str, int]:
    """task_id -> fold in 0..n_folds-1, equal sizes (remainders go to the first folds)."""
    ids = sorted(t[T.TASK_ID] for t in tasks)
    if len(ids) < n_folds:
        raise ValueError(f"{len(ids)} tasks cannot fill {n_folds} folds")
    order = np.random.default_rng(seed).permutation(len(ids))
    folds = np.array_split(order, n_folds)
    return {ids[i]: f for f, members in enumerate(folds) for i in members}
