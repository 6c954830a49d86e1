"""Seeded splits by task: never by row, so one task never lands on both sides."""

from __future__ import annotations

import numpy as np

from leakray.schema import T


BALANCE = ("none", "length")


def assign_folds(tasks: list[dict], n_folds: int = 4, seed: int = 0, balance: str = "none") -> dict[str, int]:
    """task_id -> fold in 0..n_folds-1, equal sizes (remainders go to the first folds).

    ``balance="length"``: the tasks sorted by their reference solution's length, then each run of
    ``n_folds`` neighbours dealt one to a fold in a seeded random order, so every fold (members and
    non-members alike) holds the same spread of lengths. Why: a detector's score can follow length
    with no leak at all (a sampled next-token probe's does), and a plain random split can put the
    shorter tasks on one side: on HumanEval the default split's members are shorter than its
    non-members (reference-length AUC 0.29), and with no member inserted such probes read 0.37-0.68
    over five splits (docs/LEAK.md, "Dose 0, the control"). Balanced, a difference between the
    sides is membership, not length."""
    if balance not in BALANCE:
        raise ValueError(f"fold balance {balance!r}: one of {', '.join(BALANCE)}")
    ids = sorted(t[T.TASK_ID] for t in tasks)
    if len(ids) < n_folds:
        raise ValueError(f"{len(ids)} tasks cannot fill {n_folds} folds")
    rng = np.random.default_rng(seed)
    if balance == "none":
        order = rng.permutation(len(ids))
        folds = np.array_split(order, n_folds)
        return {ids[i]: f for f, members in enumerate(folds) for i in members}
    length = {t[T.TASK_ID]: len(t[T.REFERENCE]) for t in tasks}
    by_length = sorted(ids, key=lambda i: (length[i], i))
    out = {}
    for start in range(0, len(by_length), n_folds):
        block = by_length[start:start + n_folds]
        # a last, shorter run goes to the first folds (as a plain split's remainder does), in a random order
        dealt = rng.permutation(n_folds) if len(block) == n_folds else rng.permutation(len(block))
        out.update({task: int(f) for task, f in zip(block, dealt)})
    return out
