"""Near-copies inside one benchmark: tasks whose solutions are nearly the same text.

A model that read one task of such a pair has read the other's solution too: HumanEval/56 and
HumanEval/61 are the same bracket-matching function with ``<>`` for ``()``. So an audit that flags
one of them, or a cleaned benchmark that drops one, says something about the other, and a split
that puts them on two sides mislabels one.

The bar (`SIBLINGS`): Jaccard >= 0.7 of the solutions' 5-token shingles, no text under 8 shingles.
Not the screener's 2-token shingles: a benchmark's short solutions share its language's idioms
(``for (int i = 0; i < list.size(); i++) { ... result.add(...) }``), and at 2 tokens MBJP's
"remove odd numbers", "find even numbers" and "numbers divisible by m and n" read as copies of each
other (66 pairs, 13 tasks in one chain). A run of 5 tokens is specific to the text: MBJP keeps 3
pairs (one solution under "counting sort" and "shell sort"; sums of odd and of even numbers; two
pair counts differing in one condition), HumanEval its one (0.74 at 5 tokens, 0.88 at 2)
(docs/SCREEN.md, "Near-copies inside one benchmark").

Candidates come from MinHash LSH over the solutions (the screener's vectorised signatures,
32 bands of 4 rows: a pair at the bar is a candidate with probability 0.9998), then every
candidate's Jaccard is computed exactly: no pair is reported on an estimate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from leakray.data.tasks import continuation
from leakray.schema import T
from leakray.screen.index import ScreenConfig
from leakray.screen.minhash import MinHasher
from leakray.screen.shingle import shingle_batch
from leakray.screen.verify import jaccard_exact

BANDS, ROWS = 32, 4
SIBLINGS = ScreenConfig(ngram=5)  # the screener's threshold and minimum size, on 5-token shingles (why: above)


def near_copies(ids: Sequence[str], texts: Sequence[str], config: ScreenConfig | None = None
                ) -> list[tuple[str, str, float]]:
    """Pairs (id_a, id_b, Jaccard) of texts at or above ``config.threshold`` (default `SIBLINGS`),
    id_a before id_b in ``ids``' order, sorted by Jaccard (highest first)."""
    cfg = config or SIBLINGS
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
    sets = shingle_batch(list(texts), ngram=cfg.ngram)
    keep = np.flatnonzero(sets.sizes >= cfg.min_shingles)
    if len(keep) < 2:
        return []
    sig = MinHasher(num_perm=BANDS * ROWS, seed=cfg.seed).signatures(sets, keep)
    candidates: set[tuple[int, int]] = set()
    for band in range(BANDS):
        buckets: dict[bytes, list[int]] = defaultdict(list)
        for row, key in enumerate(sig[:, band * ROWS:(band + 1) * ROWS]):
            buckets[key.tobytes()].append(row)
        for rows in buckets.values():
            candidates.update((a, b) for i, a in enumerate(rows) for b in rows[i + 1:])
    pairs = []
    for a, b in sorted(candidates):
        j = jaccard_exact(sets[keep[a]], sets[keep[b]])
        if j >= cfg.threshold:
            pairs.append((ids[keep[a]], ids[keep[b]], round(float(j), 3)))
    return sorted(pairs, key=lambda p: -p[2])


def copy_groups(pairs: Sequence[tuple[str, str, float]]) -> list[list[str]]:
    """The connected groups of near-copy ``pairs`` (a task nearly copying two others joins them),
    each sorted, sorted by their first id. Tasks in no pair are in no group."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, _ in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[str]] = defaultdict(list)
    for x in parent:
        groups[root(x)].append(x)
    return sorted(sorted(g) for g in groups.values())


def task_copy_groups(tasks: Sequence[dict], config: ScreenConfig | None = None) -> list[list[str]]:
    """`copy_groups` of a task list's near-copies: what every split by task keeps on one side
    (`benchmark.near_copies`, `data.folds.keep_together`)."""
    return copy_groups(task_near_copies(tasks, config))


def task_near_copies(tasks: Sequence[dict], config: ScreenConfig | None = None) -> list[tuple[str, str, float]]:
    """`near_copies` of benchmark tasks (schema T): their solutions, the prompt cut off."""
    return near_copies([t[T.TASK_ID] for t in tasks], [continuation(t[T.PROMPT], t[T.REFERENCE]) for t in tasks],
                       config)


def cross_near_copies(tasks: Sequence[dict], others: Sequence[dict], config: ScreenConfig | None = None
                      ) -> list[list]:
    """[id in ``tasks``, id in ``others``, Jaccard] for each task of ``tasks`` whose solution nearly
    copies one of ``others``' (its closest), highest first: a control set or a private split checked
    against the public benchmark. Ids are tagged by side, since two files may share ids."""
    tagged = [{**t, T.TASK_ID: f"a:{t[T.TASK_ID]}"} for t in tasks] + \
        [{**t, T.TASK_ID: f"b:{t[T.TASK_ID]}"} for t in others]
    out, seen = [], set()
    for x, y, j in task_near_copies(tagged, config):  # highest first: a task's closest copy is kept
        sides = {x[0]: x[2:], y[0]: y[2:]}
        if set(sides) == {"a", "b"} and sides["a"] not in seen:
            seen.add(sides["a"])
            out.append([sides["a"], sides["b"], j])
    return out
