"""The embedding stage: sliding-window encoder embeddings of the k solutions, the reference and
AdvPrompt's completions, compared the way `score` compares them (`solutions`)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from leakray.schema import C
from leakray.stages.rows import pylist, run_timed, with_columns
from leakray.stages.score import solutions


class EmbedStage:
    """Sliding-window encoder embeddings of the k solutions (k*d, row-major) and the reference (d)."""

    def __init__(self, model: str, max_tokens: int, stride: int, batch_size: int, device: str = "cpu"):
        from leakray.features.embed import SlidingWindowEmbedder
        from leakray.models.encoders import resolve_encoder

        t0 = time.perf_counter()
        self.embedder = SlidingWindowEmbedder(resolve_encoder(model), device=device, max_tokens=max_tokens,
                                              stride=stride, batch_size=batch_size)
        self._load_s = time.perf_counter() - t0

    def __call__(self, batch: pa.Table) -> pa.Table:
        return run_timed(self, "EmbedStage", "embed", self._embed, batch)

    def _embed(self, batch: pa.Table) -> pa.Table:
        completions, refs = solutions(batch)
        k = len(completions[0])
        n = len(refs)
        adv = adv_texts(batch) if C.ADV_COMPLETIONS in batch.column_names else None
        flat_adv = [t for row in adv if row is not None for t in row if t] if adv else []  # None: a failed row
        vectors = self.embedder.embed([c for row in completions for c in row] + refs + flat_adv)
        gen = vectors[: n * k].reshape(n, -1)
        out = {C.GEN_EMBEDDING: [list(map(float, g)) for g in gen],
               C.REF_EMBEDDING: [list(map(float, r)) for r in vectors[n * k: n * k + n]]}
        if adv:  # missing variants embed as zeros (their adv_kind is "")
            it, rows = iter(vectors[n * k + n:]), []
            for row in adv:
                if row is None:
                    rows.append(None)
                    continue
                rows.append([float(x) for t in row for x in (next(it) if t else np.zeros(vectors.shape[1]))])
            out[C.ADV_EMBEDDING] = rows
        return with_columns(batch, out)


def adv_texts(batch: pa.Table) -> list[list[str] | None]:
    """The comparable text of each AdvPrompt completion ("" for a missing slot)."""
    from leakray.features.expert import comparable

    out = []
    for prompts, comps, lang in zip(pylist(batch, C.ADV_PROMPTS), pylist(batch, C.ADV_COMPLETIONS),
                                    pylist(batch, C.LANGUAGE)):
        out.append(None if comps is None else
                   [comparable(p, c, lang) if p else "" for p, c in zip(prompts, comps)])
    return out
