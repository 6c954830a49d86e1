"""The scoring stage: CodeBLEU, edit distance and the expert features of each completion against
the reference (`features.expert`), on a batch's rows that did not fail."""

from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa

from leakray.schema import C
from leakray.stages.rows import pylist, row_failed, timed_batch, with_columns


def solutions(batch: pa.Table) -> tuple[list[list[str]], list[str]]:
    """What is compared and embedded, both sides alike (`features.expert.comparable`)."""
    from leakray.features.expert import comparable

    prompts, langs = pylist(batch, C.PROMPT), pylist(batch, C.LANGUAGE)
    comps = [[comparable(p, c, lang) for c in row]
             for p, row, lang in zip(prompts, pylist(batch, C.COMPLETIONS), langs)]
    refs = [comparable(p, r, lang, reference=True)
            for p, r, lang in zip(prompts, pylist(batch, C.REFERENCE), langs)]
    return comps, refs


def score_stage(batch: pa.Table) -> pa.Table:
    t0 = time.perf_counter()
    return timed_batch("score", 0.0, t0, _score(batch))


def _score(batch: pa.Table) -> pa.Table:
    from leakray.features.expert import score_batch

    completions, refs = solutions(batch)
    previous = pylist(batch, C.NOTES) if C.NOTES in batch.column_names else [[] for _ in refs]
    ok = [i for i, prev in enumerate(previous) if not row_failed(prev)]  # failed rows are not scored
    notes = [Counter() for _ in refs]
    columns = {name: [[] for _ in refs] for name in (C.CODEBLEU, C.EDIT_DISTANCE, C.EXPERT)}
    if ok:
        pick = lambda values: [values[i] for i in ok]  # noqa: E731
        scored = score_batch({
            C.REFERENCE: pick(refs), C.LANGUAGE: pick(pylist(batch, C.LANGUAGE)), C.COMPLETIONS: pick(completions),
            C.PERPLEXITY: pick(pylist(batch, C.PERPLEXITY)), C.PASSED: pick(pylist(batch, C.PASSED)),
            C.HAS_TESTS: pick(pylist(batch, C.HAS_TESTS)),
        }, row_stats=pick(notes))
        for name in columns:
            for i, v in zip(ok, scored[name]):
                columns[name][i] = list(map(float, v))
    return with_columns(batch, {**columns,
                         C.NOTES: [list(prev or []) + sorted(n.elements()) for prev, n in zip(previous, notes)]})
