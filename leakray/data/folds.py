"""Seeded splits by task: never by row, so one task never lands on both sides, and (with
`keep_together`) never a group of near-copies either."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

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


def keep_together(part: dict[str, int], groups: Iterable[Sequence[str]], length: dict[str, int] | None = None,
                  stratum: dict[str, int] | None = None) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``part`` (task id -> side of a split) with each of ``groups`` on one side, every side's size
    kept: why, a near-copy of a member is a member in substance (`screen.siblings`), so a split that
    puts it among the non-members mislabels it, and a detector trained on one copy and scored on the
    other is scored on its own training text.

    A group spanning sides moves to the side that holds most of it (ties: its first id's side); each
    task moved there trades places with a task of no group on that side, of the same ``stratum``
    where one is given (a stratified split stays stratified), nearest in ``length`` (a length-balanced
    split stays balanced), ties by id. Deterministic: no draw. A split where no group spans sides
    comes back unchanged. Returns the new map and the trades made (moved task, task traded away);
    a group with no task left to trade with stays split."""
    out = dict(part)
    grouped = {t for g in groups for t in g}
    traded: set[str] = set()  # a task traded once is not traded back by a later group
    swaps = []
    for group in sorted(sorted(g) for g in groups):
        group = [t for t in group if t in out]
        sides = Counter(out[t] for t in group)
        if len(sides) < 2:
            continue
        top = max(sides.values())
        side = next(out[t] for t in group if sides[out[t]] == top)
        for task in group:
            if out[task] == side:
                continue
            pool = [t for t, p in out.items() if p == side and t not in grouped and t not in traded
                    and (stratum is None or stratum[t] == stratum[task])]
            if not pool:
                continue
            near = (lambda t: (abs(length[t] - length[task]), t)) if length else (lambda t: (0, t))
            partner = min(pool, key=near)
            out[partner], out[task] = out[task], side
            traded.update((partner, task))
            swaps.append((task, partner))
    return out, swaps
