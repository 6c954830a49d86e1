"""A detector kept outside leakray: one file, plugged in with
``LEAKRAY_DETECTORS=toy=tests/plugins/toy_detector.py:Toy`` (tests/test_e2e.py, tests/test_audit.py).
Its statistic: the closest sample's similarity to the reference (1 - min edit distance)."""

import numpy as np

from leakray.detect.base import DetectorSpec, ScoreOnly
from leakray.schema import C


class Toy(ScoreOnly):
    spec = DetectorSpec("toy", "a test plug-in", (C.EDIT_DISTANCE,), "black box", "generation", False,
                        "1 - the smallest edit distance of a sample to the reference")

    def score(self, table):
        return np.array([1.0 - min(d) if d else 0.0 for d in table.column(C.EDIT_DISTANCE).to_pylist()],
                        dtype=np.float64)
