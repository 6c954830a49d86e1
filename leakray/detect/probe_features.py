"""The memory probes' per-task statistics (``leakray.features.probes``), from a collection: what the
three probe detectors score and what the composites take as inputs. Rows with a null probe
column are refused with the row named; a row with no probe text of its kind (a one-word
reference has no mask) is refused too, since an empty list has no statistic to offer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import _column
from leakray.errors import BadInput
from leakray.features import probes as pr
from leakray.schema import C

PREFIX_STATS = ("ngram", "lcp", "edit")
GREEDY_STATS = ("original", "preference")


def _rows(table: pa.Table, *names: str) -> list[list]:
    return [_column(table, n).to_pylist() for n in names]


def prefix_stats(table: pa.Table) -> np.ndarray:
    """[n, 3]: exact next n-gram, common-prefix share and edit similarity, each the mean over the cuts."""
    prompts, refs, cuts, comps = _rows(table, C.PROMPT, C.REFERENCE, C.PREFIX_CUTS, C.PREFIX_COMPLETIONS)
    out = np.zeros((table.num_rows, 3))
    for i, (p, r, cs, gs) in enumerate(zip(prompts, refs, cuts, comps)):
        if not cs or len(cs) != len(gs):
            raise BadInput(f"{len(cs)} prefix cuts but {len(gs)} continuations", row=i, field=C.PREFIX_COMPLETIONS)
        out[i] = np.mean([pr.prefix_match(g, pr.given_and_target(p, r, c)[1]) for c, g in zip(cs, gs)], axis=0)
    return out


def mask_stats(table: pa.Table) -> np.ndarray:
    """[n]: mean share of each hidden span the continuation before it restores (1 = exact)."""
    spans, comps = _rows(table, C.MASK_SPANS, C.MASK_COMPLETIONS)
    out = np.zeros(table.num_rows)
    for i, (ss, gs) in enumerate(zip(spans, comps)):
        if not ss or len(ss) != len(gs):
            raise BadInput(f"{len(ss)} masked spans but {len(gs)} continuations", row=i, field=C.MASK_COMPLETIONS)
        out[i] = np.mean([pr.mask_match(g, s) for s, g in zip(ss, gs)])
    return out


def greedy_stats(table: pa.Table) -> np.ndarray:
    """[n, 2]: the greedy completion's similarity to the reference continuation, and that minus
    its mean similarity to the rewrites."""
    from leakray.data.tasks import continuation

    prompts, refs, greedy, rewrites = _rows(table, C.PROMPT, C.REFERENCE, C.GREEDY_COMPLETION, C.REWRITES)
    return np.array([pr.rewrite_preference(g, continuation(p, r), rw)
                     for p, r, g, rw in zip(prompts, refs, greedy, rewrites)], dtype=np.float64).reshape(-1, 2)


def next_stats(table: pa.Table, draws_column: str = C.NEXT_DRAWS, probe: str = "next") -> np.ndarray:
    """[n]: mean over a sampled probe's cuts (``next``: the solution's; ``question``: the prompt's)
    of the log share of draws the true rest starts with (``draws_column``: the target's draws, or
    a reference model's at the same cuts)."""
    cuts_column = {"next": C.NEXT_CUTS, "question": C.QUESTION_CUTS}[probe]
    given_and_target = pr.DRAW_PROBES[probe][1]
    prompts, refs, cuts, draws = _rows(table, C.PROMPT, C.REFERENCE, cuts_column, draws_column)
    out = np.zeros(table.num_rows)
    for i, (p, r, cs, ds) in enumerate(zip(prompts, refs, cuts, draws)):
        if not cs or len(cs) != len(ds) or not all(ds):
            raise BadInput(f"{len(cs)} {probe} cuts but {len(ds)} draw lists (or an empty one)", row=i,
                           field=draws_column)
        out[i] = np.mean([pr.next_log_share(pr.next_agreement(d, given_and_target(p, r, c)[1]), len(d))
                          for c, d in zip(cs, ds)])
    return out
