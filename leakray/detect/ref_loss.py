"""Loss attack (Yeom et al. 2018): the reference continuation's mean token NLL; lower = member."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.detect.baselines import ref_loss_scores
from leakray.schema import C


class RefLoss(ScoreOnly):
    spec = DetectorSpec("ref_loss", "Yeom et al., CSF 2018 (loss attack)", (C.REF_LOSS,), "logprobs",
                        "likelihood", False, "-(mean token NLL of the reference continuation)")

    def score(self, table: pa.Table) -> np.ndarray:
        return ref_loss_scores(table)
