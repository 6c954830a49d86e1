"""Classic ML on the four expert features (the CGMIA paper's §4.4 baselines after Hisamoto et al.):
logistic regression, random forest, SVM, naive Bayes, decision tree, MLP.

Features: per task, the means over the k completions of perplexity, CodeBLEU, edit
distance and pass (the blocks of C.EXPERT), min-max scaled on the rows the model trains on
(shadow only). Hyper-parameters: a grid search on Ray Tune (``leakray.executor.tune``),
each grid point fitted on the shadow's training split and judged by AUC on its validation
split (``val_share`` of the shadow's tasks, stratified, seeded). The chosen model is the
one fitted on the training split; its decision threshold is chosen on the validation
split's scores (rows it did not train on), so every decision comes from shadow data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

import numpy as np
import pyarrow as pa
from scipy.special import expit

from leakray.detect.arrays import list_column
from leakray.detect.base import DetectorSpec, FitContext, KeepsHeldout, labels, split_by_task, task_keys
from leakray.detect.datafiles import MODEL_FILE, load_sklearn, save_sklearn
from leakray.detect.grid import TrialRunner, choose, grid_points, local_trials
from leakray.errors import BadInput
from leakray.schema import C

VAL_SHARE = 0.4  # the paper's share of held-out shadow data for its learned baselines
FEATURES = ("perplexity", "codebleu", "edit_distance", "pass")

GRIDS: dict[str, dict[str, list]] = {
    "lr": {"C": [0.01, 0.1, 1.0, 10.0, 100.0]},
    "rf": {"n_estimators": [50, 200], "max_depth": [None, 3, 6]},
    "svm": {"C": [0.1, 1.0, 10.0], "kernel": ["linear", "rbf"]},
    "nb": {"var_smoothing": [1e-9, 1e-6, 1e-3, 1e-1]},
    "dt": {"max_depth": [2, 3, 5, None], "min_samples_leaf": [1, 5]},
    "mlp": {"hidden_layer_sizes": [[16], [32, 16]], "alpha": [1e-4, 1e-2]},
}


def expert_means(table: pa.Table) -> np.ndarray:
    """[n, 4]: per-task means of the four expert blocks (C.EXPERT_BLOCKS order)."""
    expert = list_column(table, C.EXPERT, dtype=np.float64)
    if expert.shape[1] % 4 or expert.shape[1] == 0:
        raise BadInput(f"expert vector has {expert.shape[1]} entries, expected 4k", field=C.EXPERT)
    return expert.reshape(len(expert), 4, -1).mean(axis=2)


def make_model(kind: str, params: Mapping[str, Any], seed: int):
    """A min-max-scaled scikit-learn pipeline for one grid point."""
    from sklearn.naive_bayes import GaussianNB
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler
    from sklearn.svm import SVC
    from sklearn.tree import DecisionTreeClassifier

    p = dict(params)
    rs = int(np.random.SeedSequence([int(seed), 11]).generate_state(1)[0])
    if kind == "lr":
        clf = LogisticRegression(max_iter=2000, **p)
    elif kind == "rf":
        clf = RandomForestClassifier(random_state=rs, n_jobs=1, **p)
    elif kind == "svm":
        clf = SVC(random_state=rs, **p)
    elif kind == "nb":
        clf = GaussianNB(**p)
    elif kind == "dt":
        clf = DecisionTreeClassifier(random_state=rs, **p)
    elif kind == "mlp":
        p["hidden_layer_sizes"] = tuple(p["hidden_layer_sizes"])
        clf = MLPClassifier(max_iter=1000, random_state=rs, **p)
    else:
        raise BadInput(f"unknown classic model {kind!r}")
    return make_pipeline(MinMaxScaler(), clf)


_HIDDEN = {"relu": lambda h: np.maximum(h, 0.0), "tanh": np.tanh, "identity": lambda h: h, "logistic": expit}


def model_scores(model, x: np.ndarray) -> np.ndarray:
    """Higher = member: the member-class probability; the SVM's decision value (SVC gives
    probabilities only through an extra internal cross-validation); the MLP's member log-odds,
    its output unit before the logistic (from its public ``coefs_`` and ``intercepts_``): its
    probability rounds to 1.0 past a margin of ~37 and tied 6 of the demo's 82 target tasks on a
    seed (docs/DETECTORS.md: CGMIA and AdvPrompt-MIA score by log-odds for the same reason)."""
    clf = model[-1]
    if type(clf).__name__ == "SVC":
        return model.decision_function(x).astype(np.float64)
    if type(clf).__name__ == "MLPClassifier" and len(clf.classes_) == 2 and clf.activation in _HIDDEN:
        h = model[:-1].transform(x)
        for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_)):
            h = h @ w + b
            if i < len(clf.coefs_) - 1:
                h = _HIDDEN[clf.activation](h)
        return h[:, 0].astype(np.float64)
    return model.predict_proba(x)[:, 1].astype(np.float64)


def _fit_split(kind: str, params: Mapping[str, Any], seed: int, data: Mapping[str, Any]):
    tr, va = split_by_task(data["keys"], data["y"], data["val_share"], seed)
    model = make_model(kind, params, seed).fit(data["x"][tr], data["y"][tr])
    return model, va


def fit_eval(point: Mapping[str, Any], seed: int, data: Mapping[str, Any]) -> float:
    """One grid point (``kind`` + hyper-parameters), one seed: AUC on that seed's validation
    split of the shadow (runs in a Tune trial)."""
    from sklearn.metrics import roc_auc_score

    params = {k: v for k, v in point.items() if k != "kind"}
    model, va = _fit_split(point["kind"], params, seed, data)
    return float(roc_auc_score(data["y"][va], model_scores(model, data["x"][va])))


def fit_kinds(shadow: pa.Table, kinds: Iterable[str], seeds: Iterable[int],
              params: Mapping[str, Mapping[str, Any]] | None = None, storage_path=None,
              trials: TrialRunner | None = None) -> dict[str, list["ExpertML"]]:
    """Fit several classic models for several seeds with ONE search over all their grid
    points; ``{kind: [detector per seed]}``. ``trials`` runs the grid (default in-process;
    the protocols pass ``executor.tune.tune_trials``, one Ray Tune run). ``val_share`` must
    agree between kinds (they share the validation split of each seed)."""
    from leakray.detect.registry import detector_class

    kinds, seeds, params = list(kinds), [int(s) for s in seeds], dict(params or {})
    protos = {k: detector_class(k)(**dict(params.get(k) or {})) for k in kinds}
    shares = {float(p.params["val_share"]) for p in protos.values()}
    if len(shares) != 1:
        raise BadInput(f"classic models must share one val_share, got {sorted(shares)}")
    data = {"x": expert_means(shadow), "y": labels(shadow), "keys": task_keys(shadow), "val_share": shares.pop()}
    points = [pt for k in kinds for pt in grid_points(protos[k].grid(), kind=k)]
    found = (trials or local_trials)(fit_eval, points, seeds, data, name="expert-ml", storage_path=storage_path)
    searched = choose(points, found, seeds, group_key="kind")
    out = {}
    for k in kinds:
        out[k] = []
        for seed, found in zip(seeds, searched[k]):
            det = type(protos[k])(**protos[k].params)
            det._fit_chosen(data, seed, found)
            out[k].append(det)
    return out


class ExpertML(KeepsHeldout):
    """One classic model; subclasses name the kind."""

    kind: ClassVar[str]
    defaults = {"grid": None, "val_share": VAL_SHARE}  # grid None: GRIDS[kind]
    group = "expert_ml"  # every classic model asked for shares one grid search

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.model = None

    def grid(self) -> dict[str, list]:
        return dict(self.params["grid"] or GRIDS[self.kind])

    @classmethod
    def fit_seeds(cls, shadow: pa.Table, seeds: Iterable[int], params: Mapping[str, Any] | None = None,
                  context: FitContext | None = None) -> list["ExpertML"]:
        return cls.fit_group([cls.spec.name], shadow, seeds, {cls.spec.name: params or {}}, context)[cls.spec.name]

    @classmethod
    def fit_group(cls, names: list[str], shadow: pa.Table, seeds: Iterable[int],
                  params: Mapping[str, Mapping[str, Any]], context: FitContext | None = None) -> dict[str, list]:
        """Every classic model asked for in ONE search (one Ray Tune run when the protocol lends it)."""
        ctx = context or FitContext()
        storage = None if ctx.storage_path is None else Path(ctx.storage_path) / "tune"
        return fit_kinds(shadow, names, seeds, params, storage, ctx.trials)

    def _fit_chosen(self, data: Mapping[str, Any], seed: int, found: Mapping[str, Any]) -> None:
        self.seed = int(seed)
        chosen = {k: v for k, v in found["chosen"].items() if k != "kind"}
        self.model, va = _fit_split(self.kind, chosen, seed, data)
        share = data["val_share"]
        self._heldout = (data["y"][va], model_scores(self.model, data["x"][va]),
                         f"shadow, held-out validation split ({share:.0%} of tasks, also used to pick the grid point)")
        self.info = {"tuned_on": "shadow validation split (Ray Tune grid search, validation AUC)",
                     "n_configs": len(found["trials"]), "chosen": chosen, "val_auc": found["val_auc"],
                     "trials": found["trials"], "trial_seconds": sum(t["seconds"] for t in found["trials"])}

    def fit(self, shadow: pa.Table, seed: int = 0) -> "ExpertML":
        det = type(self).fit_seeds(shadow, [seed], self.params)[0]
        self.__dict__.update(det.__dict__)
        return self

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput(f"{self.spec.name}: fit (or load) the detector before scoring")
        return model_scores(self.model, expert_means(table))

    def _save_state(self, directory: Path) -> None:
        save_sklearn(self.model, directory / MODEL_FILE)

    def _load_state(self, directory: Path) -> None:
        self.model = load_sklearn(directory / MODEL_FILE)


def _spec(name: str, what: str) -> DetectorSpec:
    return DetectorSpec(name, f"the CGMIA paper §4.4 after Hisamoto et al., TACL 2020 ({what})", (C.EXPERT,),
                        "sampled logprobs", "learned", True,
                        f"{what} on per-task means of the 4 expert features, grid-searched on Ray Tune",
                        fit="ray_tune")


# Six twins on purpose: the registry names a detector by module and class ("lr": "expert_ml:LR"),
# so each kind is a class of its own; they differ only in the kind and its spec.
class LR(ExpertML):
    kind, spec = "lr", _spec("lr", "logistic regression")


class RF(ExpertML):
    kind, spec = "rf", _spec("rf", "random forest")


class SVM(ExpertML):
    kind, spec = "svm", _spec("svm", "support vector machine")


class NB(ExpertML):
    kind, spec = "nb", _spec("nb", "Gaussian naive Bayes")


class DT(ExpertML):
    kind, spec = "dt", _spec("dt", "decision tree")


class MLP(ExpertML):
    kind, spec = "mlp", _spec("mlp", "multi-layer perceptron")
