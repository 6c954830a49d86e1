"""CodeMI (Wan et al., TOSEM 2025): the ranks the model gives the ground-truth tokens, as a
fixed-length vector, into a membership classifier.

CodeMI turns the model's output on each ground-truth token into a rank-based vector. The
collection holds each reference token's rank (C.REF_TOKEN_RANK, 0 = the model's argmax);
references differ in length, so a task becomes a fixed-length vector:
- the share of tokens in each rank bucket 0, 1, 2-3, 4-7, ..., 512-1023, >= 1024 (log2 buckets)
- the 10/25/50/75/90% quantiles and the mean of log2(1 + rank).
A memorised reference has most tokens at rank 0. Classifier: scikit-learn's MLP on
standardised features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import ragged_column
from leakray.detect.base import DetectorSpec, HeldoutLearned, labels
from leakray.detect.datafiles import MODEL_FILE, load_sklearn, save_sklearn
from leakray.errors import BadInput
from leakray.schema import C

N_BUCKETS = 12  # rank 0, 1, 2-3, ..., 512-1023, >= 1024
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def rank_features(table: pa.Table) -> np.ndarray:
    """[n, N_BUCKETS + len(QUANTILES) + 1] per-task rank features."""
    rows = ragged_column(table, C.REF_TOKEN_RANK, dtype=np.int64)
    out = np.empty((len(rows), N_BUCKETS + len(QUANTILES) + 1))
    for i, r in enumerate(rows):
        if (r < 0).any():
            raise BadInput("ranks must be >= 0", row=i, field=C.REF_TOKEN_RANK)
        bucket = np.minimum(np.where(r == 0, 0, np.floor(np.log2(np.maximum(r, 1))).astype(int) + 1), N_BUCKETS - 1)
        out[i, :N_BUCKETS] = np.bincount(bucket, minlength=N_BUCKETS) / len(r)
        lr = np.log2(1.0 + r)
        out[i, N_BUCKETS:-1] = np.quantile(lr, QUANTILES)
        out[i, -1] = lr.mean()
    return out


class CodeMI(HeldoutLearned):
    spec = DetectorSpec("codemi", "Wan et al., ACM TOSEM 2025 (CodeMI)", (C.REF_TOKEN_RANK,), "logprobs",
                        "learned", True, "MLP on rank-bucket shares and rank quantiles of the reference tokens")
    defaults = {"val_share": 0.4, "hidden": [32, 16], "alpha": 1e-3, "max_iter": 1000}

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.model = None

    def _train(self, shadow: pa.Table, train_idx: np.ndarray, val_idx: np.ndarray) -> None:
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        part = shadow.take(train_idx)
        rs = int(np.random.SeedSequence([self.seed, 17]).generate_state(1)[0])
        self.model = make_pipeline(StandardScaler(), MLPClassifier(
            hidden_layer_sizes=tuple(self.params["hidden"]), alpha=float(self.params["alpha"]),
            max_iter=int(self.params["max_iter"]), random_state=rs)).fit(rank_features(part), labels(part))

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput("codemi: fit (or load) the detector before scoring")
        return self.model.predict_proba(rank_features(table))[:, 1].astype(np.float64)

    def _save_state(self, directory: Path) -> None:
        save_sklearn(self.model, directory / MODEL_FILE)

    def _load_state(self, directory: Path) -> None:
        self.model = load_sklearn(directory / MODEL_FILE)
