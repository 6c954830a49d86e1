"""leakray_combined: one classifier over CGMIA's inputs, summarised, plus the likelihood-
family and generation-only scores (and AdvPrompt's stability features when the collection
carries them). Every input group can be switched off (``groups``), so the gain of each
group is measured by running without it.

Groups (a group whose columns are missing is left out and named in ``info``):
- ``expert``: per-block mean, min and max of C.EXPERT over the k completions (12).
- ``semantic``: cosine of each completion embedding to the reference embedding (mean, max,
  min), of the mean completion embedding to the reference, and the mean pairwise cosine
  among completions (5). CGMIA's raw 2d + 4k inputs would swamp a classifier trained on
  tens of tasks; these are the similarities its frozen layers can express.
- ``likelihood``: the scores of ref_loss, min_k, min_k_pp, zlib, ref_calibrated and
  ref_calibrated_text (the same ratio over prompt and solution: on a pretraining-mixture card it
  was the best single detector, shadow AUC 0.888, while this composite without it read 0.767).
- ``generation``: the scores of detectleak, gt_match, cdd, buzzer_b.
- ``advprompt``: AdvPrompt's 27 stability features (missing variants imputed per row, as
  the advprompt detector does), when the collection carries the perturbed completions.
- ``probes``: the text-only memory probes' statistics (prefix completion: n-gram, common
  prefix, edit similarity; masked spans; greedy completion vs reference and vs its rewrites;
  the sampled next-token agreement, alone and against the reference model's), when the
  collection carries them (``leakray.detect.probe_features``).

``text_combined`` is the same classifier over what a black-box target gives: CGMIA's
generation features without perplexity (CodeBLEU, edit distance, pass; mean, min, max), the
semantic summaries (an encoder the auditor runs), the black-box generation scores and the probes.

Classifier: standardised logistic regression (few parameters for a small shadow). The
threshold comes from out-of-fold shadow probabilities (k-fold cross-fit by task, as CGMIA).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import list_column
from leakray.detect.base import DetectorSpec, KeepsHeldout, labels, missing_input, task_keys
from leakray.detect.datafiles import MODEL_FILE, load_sklearn, save_sklearn
from leakray.errors import BadInput
from leakray.schema import C

GROUPS = ("expert", "semantic", "likelihood", "generation", "advprompt", "probes")
TEXT_GROUPS = ("text_expert", "semantic", "text_generation", "probes")
LIKELIHOOD = ("ref_loss", "min_k", "min_k_pp", "zlib", "ref_calibrated", "ref_calibrated_text")
GENERATION = ("detectleak", "gt_match", "cdd", "buzzer_b")
TEXT_GENERATION = ("gt_match", "cdd")
_USED_FILE = "used_inputs.json"  # the inputs each group fed in fitting


def _expert_summary(table: pa.Table) -> np.ndarray:
    e = list_column(table, C.EXPERT, dtype=np.float64)
    blocks = e.reshape(len(e), 4, -1)
    return np.concatenate([blocks.mean(2), blocks.min(2), blocks.max(2)], axis=1)


def _text_expert_summary(table: pa.Table) -> np.ndarray:
    """CodeBLEU, edit distance and pass over the k completions (mean, min, max): the expert
    vector without perplexity, which a black-box target cannot give."""
    blocks = np.stack([list_column(table, c, dtype=np.float64) for c in (C.CODEBLEU, C.EDIT_DISTANCE, C.PASSED)],
                      axis=1)
    return np.concatenate([blocks.mean(2), blocks.min(2), blocks.max(2)], axis=1)


def _probes(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Every probe the collection carries, each left out (like a missing group) when absent."""
    from leakray.detect import probe_features as pf

    cols, used = [], []
    for name, columns, build in (
            ("prefix", (C.PREFIX_CUTS, C.PREFIX_COMPLETIONS), pf.prefix_stats),
            ("mask", (C.MASK_SPANS, C.MASK_COMPLETIONS), lambda t: pf.mask_stats(t)[:, None]),
            ("greedy", (C.GREEDY_COMPLETION, C.REWRITES), pf.greedy_stats),
            ("next", (C.PROMPT, C.REFERENCE, C.NEXT_CUTS, C.NEXT_DRAWS), lambda t: pf.next_stats(t)[:, None]),
            ("next_calibrated", (C.PROMPT, C.REFERENCE, C.NEXT_CUTS, C.NEXT_DRAWS, C.REFMODEL_NEXT_DRAWS),
             lambda t: (pf.next_stats(t) - pf.next_stats(t, C.REFMODEL_NEXT_DRAWS))[:, None])):
        if missing_input(table, columns) is None:
            try:
                cols.append(build(table))
                used.append(name)
            except BadInput:
                continue
    return (np.concatenate(cols, axis=1) if cols else np.zeros((table.num_rows, 0))), used


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def _semantic_summary(table: pa.Table) -> np.ndarray:
    ref = list_column(table, C.REF_EMBEDDING, dtype=np.float64)
    n, d = ref.shape
    gen = list_column(table, C.GEN_EMBEDDING, dtype=np.float64).reshape(n, -1, d)
    cos = np.einsum("nkd,nd->nk", _unit(gen), _unit(ref))
    k = gen.shape[1]
    pair = np.einsum("nkd,njd->nkj", _unit(gen), _unit(gen))
    off = (pair.sum((1, 2)) - k) / max(k * (k - 1), 1)
    mean_cos = np.einsum("nd,nd->n", _unit(gen.mean(1)), _unit(ref))
    return np.stack([cos.mean(1), cos.max(1), cos.min(1), mean_cos, off], axis=1)


def _scores_group(names: tuple[str, ...]):
    def build(table: pa.Table) -> tuple[np.ndarray, list[str]]:
        from leakray.detect import registry

        cols, used = [], []
        for name in names:
            if missing_input(table, registry.spec(name).columns) is None:
                try:
                    cols.append(registry.make(name).score(table))
                    used.append(name)
                except BadInput:
                    continue  # unusable in some row: left out of the group, like a missing column
        return (np.stack(cols, axis=1) if cols else np.zeros((table.num_rows, 0))), used
    return build


def _advprompt(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    from leakray.detect import advprompt as ap

    return ap.impute(ap.feature_matrix(ap.arrays_from_table(table))[0]), ["advprompt"]


_BUILDERS = {
    "expert": (lambda t: (_expert_summary(t), ["expert"]), (C.EXPERT,)),
    "semantic": (lambda t: (_semantic_summary(t), ["semantic"]), (C.GEN_EMBEDDING, C.REF_EMBEDDING)),
    "likelihood": (_scores_group(LIKELIHOOD), ()),
    "generation": (_scores_group(GENERATION), ()),
    "advprompt": (_advprompt, (C.ADV_EMBEDDING, C.ADV_PERPLEXITY, C.ADV_KIND)),
    "probes": (_probes, ()),
    "text_expert": (lambda t: (_text_expert_summary(t), ["text_expert"]), (C.CODEBLEU, C.EDIT_DISTANCE, C.PASSED)),
    "text_generation": (_scores_group(TEXT_GENERATION), ()),
}


class Combined(KeepsHeldout):
    spec = DetectorSpec("leakray_combined", "leakray", (C.EXPERT,), "logprobs", "composite", True,
                        "logistic regression over expert + semantic summaries + likelihood + generation scores")
    defaults = {"groups": list(GROUPS), "C": 1.0, "folds": 4}
    known_groups = GROUPS

    def __init__(self, **params: Any):
        super().__init__(**params)
        bad = set(self.params["groups"]) - set(self.known_groups)
        if bad or not self.params["groups"]:
            name = self.spec.name
            raise BadInput(f"{name}: groups must be a non-empty subset of {self.known_groups}, got "
                           f"{self.params['groups']}", field=f"detect.params.{name}.groups")
        self.model = None
        self.used: dict[str, list[str]] = {}

    def features(self, table: pa.Table, used: dict[str, list[str]] | None = None) -> tuple[np.ndarray, dict]:
        """The feature matrix; with ``used`` (from fitting) exactly those inputs, else all available."""
        blocks, found = [], {}
        for g in self.params["groups"]:
            build, cols = _BUILDERS[g]
            if used is not None and not used.get(g):
                continue
            if missing_input(table, cols):
                if used is not None:
                    raise BadInput(f"{self.spec.name}: input group {g!r} was used in fitting but is missing: "
                                   f"{missing_input(table, cols)}")
                continue
            x, names = build(table)
            if used is not None and names != used[g]:
                raise BadInput(f"{self.spec.name}: group {g!r} has inputs {names}, fitted on {used[g]}")
            if x.shape[1]:
                blocks.append(x)
                found[g] = names
        if not blocks:
            raise BadInput(f"{self.spec.name}: no input group is available")
        return np.concatenate(blocks, axis=1), found

    def _model(self):
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), LogisticRegression(C=float(self.params["C"]), max_iter=2000))

    def fit(self, shadow: pa.Table, seed: int = 0) -> "Combined":
        from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict

        self.seed = int(seed)
        y = labels(shadow)
        x, self.used = self.features(shadow)
        self.model = self._model().fit(x, y)
        folds = min(int(self.params["folds"]), int((y == 0).sum()), int((y == 1).sum()))
        split_seed = int(np.random.SeedSequence([self.seed, 29]).generate_state(1)[0])
        cv = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=split_seed)
        oof = cross_val_predict(self._model(), x, y, cv=cv, groups=task_keys(shadow).astype(str),
                                method="predict_proba")[:, 1]
        self._heldout = (y, oof, f"shadow, out-of-fold ({folds}-fold cross-fit by task)")
        self.info = {"groups_used": self.used,
                     "groups_missing": [g for g in self.params["groups"] if g not in self.used],
                     "n_features": int(x.shape[1])}
        return self

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput(f"{self.spec.name}: fit (or load) the detector before scoring")
        x, _ = self.features(table, self.used)
        return self.model.predict_proba(x)[:, 1].astype(np.float64)

    def _save_state(self, directory: Path) -> None:
        save_sklearn(self.model, directory / MODEL_FILE)
        (directory / _USED_FILE).write_text(json.dumps(self.used, indent=1))

    def _load_state(self, directory: Path) -> None:
        self.model = load_sklearn(directory / MODEL_FILE)
        self.used = json.loads((directory / _USED_FILE).read_text())


class TextCombined(Combined):
    spec = DetectorSpec("text_combined", "leakray", (C.COMPLETIONS,), "black box", "composite", True,
                        "logistic regression over what text gives: CodeBLEU/edit/pass summaries, semantic "
                        "summaries, gt_match and cdd, and the memory probes' statistics")
    defaults = {"groups": list(TEXT_GROUPS), "C": 1.0, "folds": 4}
    known_groups = TEXT_GROUPS
