import numpy as np
import pyarrow as pa
import pytest

from leakray.detect import baselines
from leakray.detect.arrays import list_column
from leakray.errors import BadInput
from leakray.schema import C, collection_schema


def _table(ppl, ref_loss, ed):
    sch = collection_schema()
    return pa.table({
        C.PERPLEXITY: pa.array(ppl, sch.field(C.PERPLEXITY).type),
        C.REF_LOSS: pa.array(ref_loss, sch.field(C.REF_LOSS).type),
        C.EDIT_DISTANCE: pa.array(ed, sch.field(C.EDIT_DISTANCE).type),
    })


def test_scores_only_no_decision():
    t = _table([[1, 3], [10, 12], [2, 2], [5, 5]], [0.5, 2.0, 0.5, 1.0],
               [[0.5, 0.1], [0.9, 0.8], [0.0, 1.0], [0.5, 0.5]])
    d = baselines.detectleak_scores(t)
    assert isinstance(d, np.ndarray) and d.dtype == np.float64
    np.testing.assert_allclose(d, [-2, -11, -2, -5])
    np.testing.assert_allclose(baselines.ref_loss_scores(t), [-0.5, -2.0, -0.5, -1.0])
    np.testing.assert_allclose(baselines.gt_match_scores(t), [0.9, 0.2, 1.0, 0.5])


def test_bad_input_named():
    t = _table([[1, 3], [10]], [0.5, None], [[0.1, 0.2], [0.3, 0.4]])
    with pytest.raises(BadInput, match="row 1.*perplexity"):
        baselines.detectleak_scores(t)
    with pytest.raises(BadInput, match="row 1.*ref_loss"):
        baselines.ref_loss_scores(t)
    t = _table([[1, float("nan")], [1, 2]], [0.5, 1.0], [[0.1, 0.2], [0.3, 0.4]])
    with pytest.raises(BadInput, match="row 0"):
        list_column(t, C.PERPLEXITY)
