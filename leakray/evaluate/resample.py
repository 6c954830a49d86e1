"""Bootstrap resamples of a benchmark's tasks that keep its near-copies together.

A benchmark's near-copies (one solution under two task ids: HumanEval/56 ~ /61, three pairs among
MBJP's 874 tasks; `screen.siblings`) are one task read twice: a model that saw one has seen both,
and their statistics move together. A bootstrap that resamples tasks one by one counts such a
pair as two independent draws and its interval comes out too narrow. `task_resamples` draws
whole groups instead (the cluster bootstrap): as many groups as the benchmark has, with
replacement, cut at the benchmark's size so every resample has the same length (the routes fit
all resamples in one array). A benchmark without near-copies gets the task-by-task resamples it
always had, the same draws to the index."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def group_index(task_ids: Sequence[str], groups: Sequence[Sequence[str]]) -> np.ndarray:
    """One integer per task: its near-copy group's (``groups``: lists of task ids,
    `siblings.copy_groups`), or its own where it is in none."""
    group_of = {t: i for i, g in enumerate(groups) if len(g) > 1 for t in g}
    out, seen = np.empty(len(task_ids), np.int64), {}
    for j, t in enumerate(task_ids):
        key = ("group", group_of[t]) if t in group_of else ("task", j)
        out[j] = seen.setdefault(key, len(seen))
    return out


def drawn_whole(groups: np.ndarray) -> int:
    """How many groups of two or more rows these labels (`group_index`) hold."""
    return int((np.bincount(np.asarray(groups)) > 1).sum()) if len(groups) else 0


def resampled_by(groups: np.ndarray) -> str:
    """What a bootstrap over rows with these group labels draws, for a report."""
    copies = drawn_whole(groups)
    return (f"near-copy group ({copies} group(s) of 2 or more tasks drawn whole, every other task alone)"
            if copies else "task")


def task_resamples(groups: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices [n_boot, n] of ``n_boot`` bootstrap resamples of the n rows whose group labels are
    ``groups`` (`group_index`): whole groups drawn with replacement until n rows are drawn, the last
    group cut at n. With every row its own group: ``rng.integers(0, n, n)`` per resample, as before."""
    groups = np.asarray(groups)
    n = len(groups)
    labels, first = np.unique(groups, return_index=True)
    if len(labels) == n:  # no group of two: the task-by-task bootstrap, the same stream
        return np.stack([rng.integers(0, n, n) for _ in range(int(n_boot))]) if n_boot else np.zeros((0, n), np.int64)
    members = [np.flatnonzero(groups == g) for g in labels[np.argsort(first)]]  # in the rows' order
    flat = np.concatenate(members)  # every group's rows, one after another
    size = np.array([len(m) for m in members])
    start = np.cumsum(size) - size
    n_boot, n_groups = int(n_boot), len(members)
    # each resample draws as many groups as there are (about n rows) and a few more (four sds of that
    # many groups' row count), and as many again in the rare case that some resample is still short
    extra = int(np.ceil(4 * np.sqrt(n_groups * size.var()))) + 2
    drawn = rng.integers(0, n_groups, (n_boot, n_groups + extra))
    while (size[drawn].sum(axis=1) < n).any():
        drawn = np.concatenate([drawn, rng.integers(0, n_groups, (n_boot, n_groups))], axis=1)
    lens = size[drawn]
    # the drawn groups' rows in turn, the last one cut at n: row b's position p falls in the drawn group
    # whose running row count first passes p (one search over all resamples, each shifted past the last)
    shift = (np.arange(n_boot) * (int(lens.sum(axis=1).max()) + 1))[:, None]
    ends = (np.cumsum(lens, axis=1) + shift).ravel()
    at = (np.arange(n)[None, :] + shift).ravel()
    slot = np.searchsorted(ends, at, side="right")
    within = at - (ends[slot] - lens.ravel()[slot])
    return flat[start[drawn.ravel()[slot]] + within].reshape(n_boot, n)
