"""Gotcha (Yang et al., TSE 2024): encoder embeddings of (input, completion, ground truth)
into a neural membership classifier.

Gotcha encodes one triplet per completion with CodeBERT. The collection holds the
encoder's embeddings of each completion (C.GEN_EMBEDDING) and of the reference
(C.REF_EMBEDDING) but none of the prompt, so a triplet here is the pair
[completion embedding; reference embedding]. Each of the k completions is one training
row (as Gotcha trains on each completion); a task's score is the mean member probability
over its k completions. Classifier: scikit-learn's MLP on standardised inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import list_column
from leakray.detect.base import DetectorSpec, HeldoutLearned, labels
from leakray.detect.datafiles import MODEL_FILE, load_sklearn, save_sklearn
from leakray.errors import BadInput
from leakray.schema import C


def pair_rows(table: pa.Table) -> tuple[np.ndarray, int]:
    """[n*k, 2d] rows [gen_i; ref] (task-major) and k."""
    ref = list_column(table, C.REF_EMBEDDING)
    n, d = ref.shape
    gen = list_column(table, C.GEN_EMBEDDING)
    if d == 0 or gen.shape[1] % d:
        raise BadInput(f"gen embedding width {gen.shape[1]} is not a multiple of the reference's {d}",
                       field=C.GEN_EMBEDDING)
    k = gen.shape[1] // d
    gen = gen.reshape(n, k, d)
    return np.concatenate([gen, np.repeat(ref[:, None, :], k, axis=1)], axis=2).reshape(n * k, 2 * d), k


class Gotcha(HeldoutLearned):
    spec = DetectorSpec("gotcha", "Yang et al., IEEE TSE 2024 (Gotcha)", (C.GEN_EMBEDDING, C.REF_EMBEDDING),
                        "black box", "learned", True,
                        "MLP on [completion embedding; reference embedding] per completion, mean over k")
    defaults = {"val_share": 0.4, "hidden": [128], "alpha": 1e-3, "max_iter": 200}

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.model = None

    def _train(self, shadow: pa.Table, train_idx: np.ndarray, val_idx: np.ndarray) -> None:
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        part = shadow.take(train_idx)
        x, k = pair_rows(part)
        y = np.repeat(labels(part), k)
        rs = int(np.random.SeedSequence([self.seed, 13]).generate_state(1)[0])
        self.model = make_pipeline(StandardScaler(), MLPClassifier(
            hidden_layer_sizes=tuple(self.params["hidden"]), alpha=float(self.params["alpha"]),
            max_iter=int(self.params["max_iter"]), random_state=rs)).fit(x, y)

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput("gotcha: fit (or load) the detector before scoring")
        x, k = pair_rows(table)
        return self.model.predict_proba(x)[:, 1].reshape(table.num_rows, k).mean(axis=1).astype(np.float64)

    def _save_state(self, directory: Path) -> None:
        save_sklearn(self.model, directory / MODEL_FILE)

    def _load_state(self, directory: Path) -> None:
        self.model = load_sklearn(directory / MODEL_FILE)
