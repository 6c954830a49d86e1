"""zlib ratio (Carlini et al., USENIX Security 2021): the reference continuation's loss divided
by its zlib entropy (compressed bytes). Text that is merely repetitive has a low loss and a
low zlib entropy; memorised text has a low loss for its entropy. Lower ratio = member."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

from leakray.data.tasks import continuation
from leakray.detect.arrays import scalar_column
from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.errors import BadInput
from leakray.schema import C


def zlib_entropy(text: str) -> int:
    """Bytes of the zlib-compressed UTF-8 text (Carlini et al. count the same)."""
    return len(zlib.compress(text.encode("utf-8")))


class ZlibRatio(ScoreOnly):
    spec = DetectorSpec("zlib", "Carlini et al., USENIX Security 2021 (zlib ratio)",
                        (C.REF_LOSS, C.PROMPT, C.REFERENCE), "logprobs", "likelihood", False,
                        "-(reference-continuation loss / zlib bytes of the continuation)")

    def score(self, table: pa.Table) -> np.ndarray:
        loss = scalar_column(table, C.REF_LOSS)
        prompts, refs = table.column(C.PROMPT).to_pylist(), table.column(C.REFERENCE).to_pylist()
        out = np.empty(len(loss))
        for i, (p, r) in enumerate(zip(prompts, refs)):
            if p is None or r is None:
                raise BadInput("null value", row=i, field=C.PROMPT if p is None else C.REFERENCE)
            # the same text REF_LOSS scored: the reference's continuation of the prompt
            out[i] = -loss[i] / zlib_entropy(continuation(p, r))
        return out
