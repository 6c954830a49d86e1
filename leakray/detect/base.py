"""What every detector is: a spec (name, paper, input columns, access level) and a
``fit`` / ``score`` / ``save`` / ``load`` object.

- ``fit(shadow, seed)`` learns from the labelled shadow collection (a no-op for
  score-only detectors); ``fit_seeds(shadow, seeds)`` fits one detector per seed and may
  share work between seeds (one Ray Tune run for all of them, say).
- ``score(table)`` -> float64 [n], higher = member. No decision: the threshold is chosen
  on shadow data by ``threshold(shadow, rule)`` and applied unchanged to the target.
- ``heldout(shadow)`` -> the shadow labels and scores the threshold is chosen on. For a
  score-only detector that is the whole shadow; a learned one returns rows it did not
  train on (its validation split, or out-of-fold scores), because scores on its own
  training rows are overfit.
- ``save(dir)`` / ``Detector.load(dir)``: ``detector.json`` (name, params, seed, info,
  threshold) plus whatever state the detector writes itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import scalar_column
from leakray.detect.datafiles import read_meta, write_meta
from leakray.errors import BadInput
from leakray.evaluate.thresholds import DEFAULT_RULE, choose_threshold
from leakray.schema import C, filled_by

FIT_KINDS = ("none", "local", "ray_train", "ray_tune")
# What the auditor needs from the model, from least to most (a level allows every level before it):
# - "black box": the text of its completions (and an encoder the auditor runs);
# - "sampled logprobs": and the log-probabilities of the tokens it sampled (an API's `logprobs` on
#   generation: the perplexities of its own completions), but no score for a given text;
# - "logprobs": and the log-probabilities of any given text (an API's `echo`, or prompt scoring:
#   the reference solution's tokens under the model);
# - "weights": the model itself (a full distribution per token, ranks).
ACCESS_LEVELS = ("black box", "sampled logprobs", "logprobs", "weights")
FAMILIES = ("likelihood", "generation", "learned", "composite")
META_FILE = "detector.json"


@dataclass(frozen=True)
class DetectorSpec:
    name: str  # key in report.json
    paper: str  # who published it (or "leakray" for our own)
    columns: tuple[str, ...]  # collection columns it needs, non-null in every row
    access: str  # one of ACCESS_LEVELS: what the auditor needs from the model
    family: str  # one of FAMILIES
    learns: bool  # trains on the shadow (so its result depends on the seed)
    summary: str  # one line: the statistic
    # how it fits (FIT_KINDS; default: "local" if it learns, else "none"); where a ray_train or
    # ray_tune fit runs is the protocol's choice, through the FitContext it hands in
    fit: str | None = None

    def __post_init__(self):
        if self.access not in ACCESS_LEVELS or self.family not in FAMILIES:
            raise BadInput(f"detector {self.name}: bad access {self.access!r} or family {self.family!r}")
        if self.fit is None:
            object.__setattr__(self, "fit", "local" if self.learns else "none")
        if self.fit not in FIT_KINDS or (self.fit == "none") == self.learns:
            raise BadInput(f"detector {self.name}: bad fit {self.fit!r} (one of {FIT_KINDS}; 'none' iff it "
                           "does not learn)")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "paper": self.paper, "columns": list(self.columns), "access": self.access,
                "family": self.family, "learns": self.learns, "fit": self.fit, "summary": self.summary}


@dataclass
class FitContext:
    """What a run lends a learned detector's fit, handed in by the protocol: a detector never
    chooses where it runs. ``trials`` runs a grid search's trials (None: in-process, one after
    the other; the protocols pass one Ray Tune run), ``train_seeds`` trains every seed of a
    detector whose fit is ``ray_train`` (None: in-process; the protocols pass one Ray Train run),
    ``storage_path`` is where such runs keep their files."""

    storage_path: Any = None
    trials: Any = None
    train_seeds: Any = None
    threshold_rule: str = DEFAULT_RULE
    progress: bool = False


def collection_access(table: pa.Table) -> str:
    """What the model behind a collection gave (an ACCESS_LEVELS entry): "weights" when the
    reference has a full distribution per token (Min-K%++'s mu, an in-process model),
    "logprobs" when the reference solution has token log-probabilities (an endpoint that scores
    given text), "sampled logprobs" when only the samples have finite perplexities (an endpoint
    that returns log-probabilities of what it generates but refuses `echo`), else "black box"
    (text only)."""
    import math

    def filled(name: str) -> bool:
        return name in table.column_names and table.column(name).null_count < table.num_rows

    if filled(C.REF_TOKEN_MU):
        return "weights"
    if filled(C.REF_TOKEN_LOGPROBS):
        return "logprobs"
    if filled(C.PERPLEXITY) and any(math.isfinite(v) for row in table.column(C.PERPLEXITY).to_pylist()
                                    for v in row or []):
        return "sampled logprobs"
    return "black box"


def access_allows(given: str, needed: str) -> bool:
    """Whether a detector needing ``needed`` can run on a model that gives ``given``."""
    return ACCESS_LEVELS.index(needed) <= ACCESS_LEVELS.index(given)


def missing_input(table: pa.Table, columns: Iterable[str]) -> str | None:
    """Why a table cannot feed a detector that needs ``columns`` (None if it can).

    An all-null column is one whose pass was off or the backend could not fill; a column null in only some rows
    is caught later, by the detector, with the row named."""
    for name in columns:
        if name not in table.column_names:
            return f"collection lacks column {name!r}"
        col = table.column(name)
        if table.num_rows and col.null_count == table.num_rows:
            switch = filled_by(name)
            return (f"column {name!r} is empty (its pass was switched off: {switch}; or the sampling backend could "
                    "not fill it)" if switch else f"column {name!r} is empty (the sampling backend could not fill it)")
    return None


def labels(table: pa.Table, which: str = "shadow") -> np.ndarray:
    y = scalar_column(table, C.MEMBER, dtype=np.int8)
    bad = ~np.isin(y, (0, 1))
    if bad.any():
        raise BadInput(f"{which} collection needs member 0/1, got {y[bad][0]}", row=int(np.flatnonzero(bad)[0]),
                       field=C.MEMBER)
    if len(np.unique(y)) < 2:
        raise BadInput(f"{which} collection holds one class only", field=C.MEMBER)
    return y


def task_keys(table: pa.Table) -> np.ndarray:
    """(benchmark, task_id) as one string per row: the unit every split keeps together. Where the
    protocol named near-copy groups (`keyed_by_copies`), the tasks of one group share one key."""
    if C.SPLIT_KEY in table.column_names:
        return np.asarray(table.column(C.SPLIT_KEY).to_pylist(), dtype=object)
    if C.TASK_ID not in table.column_names:
        return np.arange(table.num_rows).astype(str).astype(object)
    ids = table.column(C.TASK_ID).to_pylist()
    bench = table.column(C.BENCHMARK).to_pylist() if C.BENCHMARK in table.column_names else [""] * len(ids)
    return np.asarray([f"{b}\x1f{t}" for b, t in zip(bench, ids)], dtype=object)


def keyed_by_copies(table: pa.Table, groups: Sequence[Sequence[str]]) -> pa.Table:
    """``table`` with C.SPLIT_KEY: each task's own key (`task_keys`), or the key of the first task
    of its near-copy group (``groups``: lists of task ids, `siblings.copy_groups`).

    Why: a learned detector that reads a task's text (a reference embedding, its tokens) and is
    validated or cross-fitted on a near-copy of one of its training tasks is scored on its own
    training text; its validation AUC, and the cut and primary chosen on it, come out too good.
    Without groups the table comes back as it was (the splits as before)."""
    if C.SPLIT_KEY in table.column_names:
        table = table.drop_columns([C.SPLIT_KEY])
    if not any(len(g) > 1 for g in groups):
        return table
    ids, keys = table.column(C.TASK_ID).to_pylist(), task_keys(table).tolist()
    first = {t: g[0] for g in groups if len(g) > 1 for t in g}
    key_of = dict(zip(ids, keys))
    merged = [key_of.get(first[t], f"copies\x1f{first[t]}") if t in first else k for t, k in zip(ids, keys)]
    return table.append_column(C.SPLIT_KEY, pa.array(merged, pa.string()))


def split_by_task(keys: np.ndarray, y: np.ndarray, val_share: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, val): ``val_share`` of the tasks, stratified by label, seeded."""
    from sklearn.model_selection import train_test_split

    if not 0.0 < val_share < 1.0:
        raise BadInput(f"val_share must lie in (0, 1), got {val_share}")
    keys = np.asarray(keys).astype(str)
    uniq, first = np.unique(keys, return_index=True)
    group_y = np.asarray(y)[first]
    if min((group_y == 0).sum(), (group_y == 1).sum()) < 2:
        raise BadInput("a validation split needs at least 2 tasks of each class", field=C.MEMBER)
    split_seed = int(np.random.SeedSequence([int(seed), 7]).generate_state(1)[0])
    tr, va = train_test_split(uniq, test_size=val_share, stratify=group_y, random_state=split_seed)
    val = np.isin(keys, va)
    return np.flatnonzero(~val), np.flatnonzero(val)


class Detector:
    """Base class. Subclasses set ``spec`` and ``defaults`` and implement ``score``."""

    spec: ClassVar[DetectorSpec]
    defaults: ClassVar[Mapping[str, Any]] = {}
    group: ClassVar[str | None] = None  # detectors of one group are fitted by one fit_group call
    # a learned detector whose inputs cost more to build than its fits (the composites): the detect
    # stage fits all its seeds in one task, where the inputs are built once per collection
    # (``leakray.detect.arrays.per_table``), instead of one task per seed building them again
    seeds_together: ClassVar[bool] = False

    def __init__(self, **params: Any):
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise BadInput(f"detector {self.spec.name}: unknown parameters {sorted(unknown)}; "
                           f"known: {sorted(self.defaults)}", field=f"detect.params.{self.spec.name}")
        self.params: dict[str, Any] = {**self.defaults, **params}
        self.seed: int | None = None
        self.info: dict[str, Any] = {}  # what fitting chose (tuned config, ensemble weights, ...)
        self.threshold_: dict[str, Any] | None = None  # Threshold.to_dict() once chosen

    # -- learning --------------------------------------------------------------------
    def fit(self, shadow: pa.Table, seed: int = 0) -> "Detector":
        self.seed = int(seed)
        return self

    @classmethod
    def fit_seeds(cls, shadow: pa.Table, seeds: Iterable[int], params: Mapping[str, Any] | None = None,
                  context: FitContext | None = None) -> list["Detector"]:
        """One fitted detector per seed; ``context`` lends run facilities (a Ray Tune or Ray Train
        runner, where they store files)."""
        return [cls(**dict(params or {})).fit(shadow, s) for s in seeds]

    @classmethod
    def fit_group(cls, names: list[str], shadow: pa.Table, seeds: Iterable[int],
                  params: Mapping[str, Mapping[str, Any]], context: FitContext | None = None) -> dict[str, list]:
        """Several detectors of one ``group`` fitted together ({name: [detector per seed]}), when
        one run serves them all (one grid search over several models); without a group, itself."""
        if list(names) != [cls.spec.name]:
            raise ValueError(f"{cls.spec.name} has no group to fit {names} with")
        return {cls.spec.name: cls.fit_seeds(shadow, seeds, params.get(cls.spec.name), context)}

    def score(self, table: pa.Table) -> np.ndarray:
        raise NotImplementedError

    # -- decisions -------------------------------------------------------------------
    def heldout(self, shadow: pa.Table) -> tuple[np.ndarray, np.ndarray, str]:
        return labels(shadow), self.score(shadow), "shadow"

    def threshold(self, shadow: pa.Table, rule: str = DEFAULT_RULE) -> dict[str, Any]:
        y, s, on = self.heldout(shadow)
        self.threshold_ = choose_threshold(y, s, rule, chosen_on=on).to_dict()
        return self.threshold_

    # -- persistence -----------------------------------------------------------------
    def _save_state(self, directory: Path) -> None:
        """Write learned state beside detector.json (nothing for score-only detectors)."""

    def _load_state(self, directory: Path) -> None:
        pass

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._save_state(directory)
        meta = {"name": self.spec.name, "params": self.params, "seed": self.seed, "info": self.info,
                "threshold": self.threshold_}
        return write_meta(directory, META_FILE, meta, default=_jsonable)

    @classmethod
    def load(cls, directory: str | Path) -> "Detector":
        directory = Path(directory)
        meta = read_meta(directory, META_FILE, "detector")
        if meta.get("name") != cls.spec.name:
            raise BadInput(f"saved detector is {meta.get('name')!r}, not {cls.spec.name!r}",
                           path=str(directory / META_FILE))
        det = cls(**meta["params"])
        det.seed, det.info, det.threshold_ = meta["seed"], meta["info"], meta["threshold"]
        det._load_state(directory)
        return det


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (np.ndarray, tuple, set)):
        return list(v)
    raise TypeError(f"not JSON-serialisable: {type(v).__name__}")


class ScoreOnly(Detector):
    """A detector with no training: ``fit`` only records the seed."""


class KeepsHeldout(Detector):
    """A detector whose ``fit`` keeps the held-out (labels, scores, where) its threshold is
    chosen on, in ``self._heldout``; before a fit there is none to choose on."""

    def __init__(self, **params: Any):
        super().__init__(**params)
        self._heldout: tuple[np.ndarray, np.ndarray, str] | None = None

    def heldout(self, shadow: pa.Table) -> tuple[np.ndarray, np.ndarray, str]:
        if self._heldout is None:
            raise BadInput(f"{self.spec.name}: fit the detector before choosing its threshold")
        return self._heldout


class HeldoutLearned(KeepsHeldout):
    """A detector trained on one split of the shadow's tasks; the other ``val_share`` of the
    tasks (stratified, seeded) supplies the scores its threshold is chosen on (and, for the
    neural ones, the epoch to keep). Subclasses implement ``_train(shadow, train_idx, val_idx)``
    and ``score``."""

    defaults: ClassVar[Mapping[str, Any]] = {"val_share": 0.4}

    def fit(self, shadow: pa.Table, seed: int = 0) -> "HeldoutLearned":
        self.seed = int(seed)
        y = labels(shadow)
        share = float(self.params["val_share"])
        tr, va = split_by_task(task_keys(shadow), y, share, self.seed)
        self._train(shadow, tr, va)
        self._heldout = (y[va], self.score(shadow.take(va)),
                         f"shadow, held-out validation split ({share:.0%} of tasks)")
        self.info.update(n_train=int(len(tr)), n_val=int(len(va)))
        return self

    def _train(self, shadow: pa.Table, train_idx: np.ndarray, val_idx: np.ndarray) -> None:
        raise NotImplementedError
