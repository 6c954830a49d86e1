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
  the sampled next-token agreement at the solution's and at the prompt's cuts, each alone and
  against the reference models'), when the collection carries them (``leakray.detect.probe_features``).

``text_combined`` is the same classifier over what a black-box target gives: CGMIA's
generation features without perplexity (CodeBLEU, edit distance, pass; mean, min, max), the
semantic summaries (an encoder the auditor runs), the black-box generation scores and the probes.

Combiner (``combiner``):
- ``logistic``: standardised logistic regression (few parameters for a small shadow);
- ``unit``: an improper linear model (Dawes 1979): each input standardised on the shadow,
  oriented by its shadow AUC, and averaged with weight |AUC - 0.5|; inputs within ``margin`` of
  chance on the shadow are left out (the best one is always kept). Nothing but a direction and a
  strength per input is estimated, so it does not chase noise when the shadow is small and most
  inputs are near chance, the case of faint leaks (docs/LEAK.md: at dose 16 the logistic text
  composite read 0.714 against its best input's 0.797).
- ``pooled``: the sampled next-token statistics averaged with equal weights, standardised on the
  shadow and never re-oriented by it, so a faint shadow cannot spoil them (on the dose-4 sweep the
  shadow's best sampled input was the question's and the target's the solution's: weights learned
  from the shadow follow the shadow).
  - ``text_combined``: one reading per probe (the solution's cuts, the prompt's: independent
    draws), its draws calibrated against the collection's reference model (``READINGS``; against
    the second reference where only that one drew), and nothing else. The raw shares and a second
    reference's calibration re-read the same draws (uncalibrated, or against a farther reference),
    and a screen of the other ~25 inputs at 1.96 null standard errors let one noise input in most
    of the time, at the weight of a probe. Over five member splits of the dose sweep (docs/LEAK.md,
    "The pooled average, its readings only") the two readings alone read 0.691 / 0.925 at doses
    4 / 16 where all six sampled statistics plus the screen read 0.659 / 0.879.
  - ``leakray_combined``: all six sampled statistics (``SAMPLED``: each probe alone and against
    each reference model), plus any other input whose shadow AUC clears chance by 1.96 null
    standard errors (weight +-1), which lets the likelihood family's exact ratios in.
- ``auto`` (the default): the candidates are cross-fitted on the shadow (the same k folds by task);
  ``pooled`` is a candidate where the collection has the draws it averages.
  - ``text_combined`` keeps the simplest one whose out-of-fold AUC is within one standard error of
    the best's (the one-standard-error rule of Breiman et al. 1984; the AUC's standard error by
    Hanley & McNeil 1982): ``pooled`` fits a centre and scale per reading, ``unit`` a direction and
    strength per input, ``logistic`` a weight per input. On a faint leak's shadow of 41 + 41 tasks
    a learned combiner's out-of-fold lead of a few hundredths is noise, and the target disagreed
    with it in most such cases (the same section); a strong leak's clear lead stands.
  - ``leakray_combined`` keeps the one with the highest out-of-fold AUC (a tie keeps
    ``logistic``, the first). Measured on the dose-16 sweep (docs/LEAK.md): the shadow chose
    ``logistic`` (0.91 against 0.79), and the target agreed. Over five member splits it stays
    within -0.026 to +0.015 of the exact likelihood ratios it combines, and averaging those ratios
    alone with the one-SE rule was not better against a non-oracle reference (docs/LEAK.md, "The
    all-access composite against the exact likelihood ratios").
The threshold comes from the chosen combiner's out-of-fold shadow scores (k-fold cross-fit by
task, as CGMIA).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from leakray.detect.arrays import list_column, per_table
from leakray.detect.base import DetectorSpec, KeepsHeldout, labels, missing_input, task_keys
from leakray.detect.datafiles import MODEL_FILE, load_sklearn, save_sklearn
from leakray.errors import BadInput
from leakray.evaluate.metrics import auc_standard_error, column_auc
from leakray.schema import C

GROUPS = ("expert", "semantic", "likelihood", "generation", "advprompt", "probes")
TEXT_GROUPS = ("text_expert", "semantic", "text_generation", "probes")
LIKELIHOOD = ("ref_loss", "min_k", "min_k_pp", "zlib", "ref_calibrated", "ref_calibrated_text")
GENERATION = ("detectleak", "gt_match", "cdd", "buzzer_b")
TEXT_GENERATION = ("gt_match", "cdd")
_USED_FILE = "used_inputs.json"  # the inputs each group fed in fitting
_UNIT_FILE = "unit_weights.json"  # the unit combiner's centre, scale and weight per input
COMBINERS = ("logistic", "unit", "pooled")  # and "auto" (module docstring)
SIMPLEST_FIRST = ("pooled", "unit", "logistic")  # fewest numbers fitted on the shadow first
# inputs of the probes group, in order, with the columns each gives (the others give one)
PROBE_WIDTHS = {"prefix": 3, "greedy": 2}
# the sampled next-token statistics: one quantity (the reference text's next-token probability,
# alone or against a reference model's) read at the solution's and at the prompt's cuts;
# leakray_combined's ``pooled`` averages them all
SAMPLED = ("next", "next_calibrated", "next_calibrated_alt", "question", "question_calibrated",
           "question_calibrated_alt")
# text_combined's ``pooled``: one reading per probe, against the collection's reference model, else
# against the second one (the first of each pair the fit has)
READINGS = (("next_calibrated", "next_calibrated_alt"), ("question_calibrated", "question_calibrated_alt"))
SCREEN_Z = 1.96  # leakray_combined's ``pooled``: other inputs enter beyond this many null standard errors


class UnitWeights:
    """The ``unit`` combiner (module docstring), with the two methods ``Combined`` calls."""

    def __init__(self, margin: float = 0.05):
        self.margin = float(margin)
        self.mu = self.sd = self.w = None

    def fit(self, x: np.ndarray, y: np.ndarray) -> "UnitWeights":
        self.mu, self.sd = x.mean(0), x.std(0)
        auc = np.where(self.sd > 0, column_auc(y, x), 0.5)
        w = auc - 0.5
        keep = np.abs(w) >= self.margin
        keep[np.argmax(np.abs(w))] = True  # never an empty combination
        self.w = np.where(keep, w, 0.0)
        self.sd = np.where(self.sd > 0, self.sd, 1.0)
        return self

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        z = ((x - self.mu) / self.sd) @ self.w / max(np.abs(self.w).sum(), 1e-12)
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))  # monotone: ranks and cuts are the average's
        return np.stack([1 - p, p], axis=1)

    def state(self) -> dict:
        return {"margin": self.margin, "mu": self.mu.tolist(), "sd": self.sd.tolist(), "w": self.w.tolist()}

    @classmethod
    def from_state(cls, d: dict) -> "UnitWeights":
        u = cls(d["margin"])
        u.mu, u.sd, u.w = (np.asarray(d[k], dtype=np.float64) for k in ("mu", "sd", "w"))
        return u


class PooledWeights(UnitWeights):
    """The ``pooled`` combiner (module docstring): the inputs named ``pooled`` (a mask over the
    columns) with weight +1 each; with a screen (``z``), every other input with weight +-1 where its
    shadow AUC is beyond chance by ``z`` null standard errors (Hanley & McNeil: sqrt((n0 + n1 + 1) /
    (12 n0 n1)), 0.064 at 41 + 41 tasks), else 0; without one (``z`` None), 0. Each standardised on
    the shadow. Nothing is estimated for the pooled inputs but their centre and scale, so a faint
    shadow cannot point them the wrong way. With nothing pooled or screened in, the input whose
    shadow AUC is farthest from chance, oriented by it."""

    def __init__(self, pooled: np.ndarray, z: float | None = None):
        super().__init__(0.0)
        self.pooled, self.z = np.asarray(pooled, dtype=bool), None if z is None else float(z)

    def fit(self, x: np.ndarray, y: np.ndarray) -> "PooledWeights":
        self.mu, sd = x.mean(0), x.std(0)
        auc = np.where(sd > 0, column_auc(y, x), 0.5)
        screened = np.zeros(x.shape[1])
        if self.z is not None:
            # at AUC 0.5 Hanley & McNeil's standard error is the Mann-Whitney null's sqrt((n0 + n1 + 1) / (12 n0 n1))
            se = auc_standard_error(0.5, int((y == 1).sum()), int((y == 0).sum()))
            screened = np.where(np.abs(auc - 0.5) > self.z * se, np.sign(auc - 0.5), 0.0)
        self.w = np.where(self.pooled, 1.0, screened)
        if not self.w.any():
            best = int(np.argmax(np.abs(auc - 0.5)))
            self.w[best] = np.sign(auc[best] - 0.5) or 1.0
        self.sd = np.where(sd > 0, sd, 1.0)
        return self

    def state(self) -> dict:
        return {**super().state(), "pooled": self.pooled.tolist(), "z": self.z}

    @classmethod
    def from_state(cls, d: dict) -> "PooledWeights":
        u = cls(np.asarray(d["pooled"], dtype=bool), d.get("z"))
        u.mu, u.sd, u.w = (np.asarray(d[k], dtype=np.float64) for k in ("mu", "sd", "w"))
        return u


def choose_combiner(oof_auc: dict[str, float], n_pos: int, n_neg: int) -> str:
    """``text_combined``'s ``auto`` (module docstring): the simplest combiner whose out-of-fold AUC
    is within one standard error of the best's."""
    best = max(oof_auc.values())
    floor = best - auc_standard_error(best, n_pos, n_neg)
    return next(n for n in SIMPLEST_FIRST if n in oof_auc and oof_auc[n] >= floor)


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

    stats: dict[tuple[str, str], np.ndarray] = {}

    def draws_of(probe: str, column: str) -> np.ndarray:
        """A model's statistic of a sampled probe, computed once: the target's is read three times."""
        if (probe, column) not in stats:
            stats[probe, column] = pf.next_stats(table, column, probe=probe)
        return stats[probe, column]

    def sampled(name: str, probe: str, cuts: str, draws: str, reference: str | None):
        columns = (C.PROMPT, C.REFERENCE, cuts, draws) + ((reference,) if reference else ())
        if reference is None:
            return name, columns, lambda t: draws_of(probe, draws)[:, None]
        return name, columns, lambda t: (draws_of(probe, draws) - draws_of(probe, reference))[:, None]

    cols, used = [], []
    for name, columns, build in (
            ("prefix", (C.PREFIX_CUTS, C.PREFIX_COMPLETIONS), pf.prefix_stats),
            ("mask", (C.MASK_SPANS, C.MASK_COMPLETIONS), lambda t: pf.mask_stats(t)[:, None]),
            ("greedy", (C.GREEDY_COMPLETION, C.REWRITES), pf.greedy_stats),
            sampled("next", "next", C.NEXT_CUTS, C.NEXT_DRAWS, None),
            sampled("next_calibrated", "next", C.NEXT_CUTS, C.NEXT_DRAWS, C.REFMODEL_NEXT_DRAWS),
            # a second reference model's draws, where the collection has them (simulate's non-oracle
            # reference): another estimate of the same difference, with the reference's noise drawn afresh
            sampled("next_calibrated_alt", "next", C.NEXT_CUTS, C.NEXT_DRAWS, C.REFALT_NEXT_DRAWS),
            # the same three at the prompt's cuts: other positions, so noise independent of the above
            sampled("question", "question", C.QUESTION_CUTS, C.QUESTION_DRAWS, None),
            sampled("question_calibrated", "question", C.QUESTION_CUTS, C.QUESTION_DRAWS, C.REFMODEL_QUESTION_DRAWS),
            sampled("question_calibrated_alt", "question", C.QUESTION_CUTS, C.QUESTION_DRAWS,
                    C.REFALT_QUESTION_DRAWS)):
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
    defaults = {"groups": list(GROUPS), "C": 1.0, "folds": 4, "combiner": "auto", "margin": 0.05}
    known_groups = GROUPS
    seeds_together = True  # its inputs (the probes' statistics most) cost more than its fits
    # ``pooled``'s inputs and ``auto``'s rule (module docstring)
    pools_readings_only = False
    simplest_within_one_se = False

    def __init__(self, **params: Any):
        super().__init__(**params)
        name = self.spec.name
        bad = set(self.params["groups"]) - set(self.known_groups)
        if bad or not self.params["groups"]:
            raise BadInput(f"{name}: groups must be a non-empty subset of {self.known_groups}, got "
                           f"{self.params['groups']}", field=f"detect.params.{name}.groups")
        if self.params["combiner"] not in (*COMBINERS, "auto"):
            raise BadInput(f"{name}: combiner must be one of {(*COMBINERS, 'auto')}, got {self.params['combiner']!r}",
                           field=f"detect.params.{name}.combiner")
        self.model = None
        self.used: dict[str, list[str]] = {}

    def features(self, table: pa.Table, used: dict[str, list[str]] | None = None) -> tuple[np.ndarray, dict]:
        """The feature matrix; with ``used`` (from fitting) exactly those inputs, else all available."""
        blocks, found = [], {}
        self._widths: dict[str, int] = {}  # columns per group, in order (what `_pooled_mask` reads)
        for g in self.params["groups"]:
            build, cols = _BUILDERS[g]
            if used is not None and not used.get(g):
                continue
            if missing_input(table, cols):
                if used is not None:
                    raise BadInput(f"{self.spec.name}: input group {g!r} was used in fitting but is missing: "
                                   f"{missing_input(table, cols)}")
                continue
            x, names = per_table(table, (__name__, g), lambda: build(table))
            names = list(names)
            if used is not None and names != used[g]:
                raise BadInput(f"{self.spec.name}: group {g!r} has inputs {names}, fitted on {used[g]}")
            if x.shape[1]:
                blocks.append(x)
                found[g] = names
                self._widths[g] = x.shape[1]
        if not blocks:
            raise BadInput(f"{self.spec.name}: no input group is available")
        return np.concatenate(blocks, axis=1), found

    def _pooled_inputs(self) -> list[str]:
        """What ``pooled`` averages here: ``READINGS`` (per probe, the first of its pair the fit has)
        or every ``SAMPLED`` statistic the fit has."""
        have = self.used.get("probes", [])
        if self.pools_readings_only:
            return [next(n for n in pair if n in have) for pair in READINGS if set(have) & set(pair)]
        return [n for n in have if n in SAMPLED]

    def _pooled_mask(self) -> np.ndarray:
        """Per feature column of the fitted inputs: whether ``pooled`` averages it."""
        pooled = set(self._pooled_inputs())
        mask: list[bool] = []
        for g, names in self.used.items():
            widths = [PROBE_WIDTHS.get(n, 1) if g == "probes" else 1 for n in names]
            if g != "probes" and sum(widths) != self._widths[g]:  # summarised under its own name (expert, semantic)
                mask += [False] * self._widths[g]
                continue
            for name, width in zip(names, widths):
                mask += [name in pooled] * width
        if len(mask) != sum(self._widths.values()):
            raise BadInput(f"{self.spec.name}: the probes group's columns do not match its inputs {self.used}")
        return np.array(mask, dtype=bool)

    def _candidates(self) -> tuple[str, ...]:
        """The combiners ``auto`` compares: ``pooled`` only where the shadow has an input it averages."""
        return tuple(c for c in COMBINERS if c != "pooled" or self._pooled_inputs())

    def _model(self, combiner: str):
        if combiner == "unit":
            return UnitWeights(self.params["margin"])
        if combiner == "pooled":
            return PooledWeights(self._pooled_mask(), None if self.pools_readings_only else SCREEN_Z)
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), LogisticRegression(C=float(self.params["C"]), max_iter=2000))

    def fit(self, shadow: pa.Table, seed: int = 0) -> "Combined":
        from sklearn.metrics import roc_auc_score
        from sklearn.model_selection import StratifiedGroupKFold

        self.seed = int(seed)
        y = labels(shadow)
        x, self.used = self.features(shadow)
        folds = min(int(self.params["folds"]), int((y == 0).sum()), int((y == 1).sum()))
        split_seed = int(np.random.SeedSequence([self.seed, 29]).generate_state(1)[0])
        cv = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=split_seed)
        splits = list(cv.split(x, y, groups=task_keys(shadow).astype(str)))
        choice = self.params["combiner"]
        candidates = self._candidates() if choice == "auto" else (choice,)
        oof = {}
        for name in candidates:
            oof[name] = np.zeros(len(y))
            for tr, te in splits:
                oof[name][te] = self._model(name).fit(x[tr], y[tr]).predict_proba(x[te])[:, 1]
        oof_auc = {name: float(roc_auc_score(y, v)) for name, v in oof.items()}
        chosen = choose_combiner(oof_auc, int((y == 1).sum()), int((y == 0).sum())) if self.simplest_within_one_se \
            else max(candidates, key=lambda n: oof_auc[n])  # a tie keeps logistic, the first
        self.model = self._model(chosen).fit(x, y)
        self._heldout = (y, oof[chosen], f"shadow, out-of-fold ({folds}-fold cross-fit by task)")
        self.info = {"groups_used": self.used,
                     "groups_missing": [g for g in self.params["groups"] if g not in self.used],
                     "n_features": int(x.shape[1]), "combiner": chosen,
                     "oof_auc": {n: round(v, 4) for n, v in oof_auc.items()}}
        if chosen == "pooled":
            self.info["pooled_inputs"] = self._pooled_inputs()
        if isinstance(self.model, UnitWeights):
            self.info["unit_weights"] = [round(float(v), 4) for v in self.model.w]
        return self

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput(f"{self.spec.name}: fit (or load) the detector before scoring")
        x, _ = self.features(table, self.used)
        return self.model.predict_proba(x)[:, 1].astype(np.float64)

    def _save_state(self, directory: Path) -> None:
        if isinstance(self.model, UnitWeights):
            (directory / _UNIT_FILE).write_text(json.dumps(self.model.state()))
        else:
            save_sklearn(self.model, directory / MODEL_FILE)
        (directory / _USED_FILE).write_text(json.dumps(self.used, indent=1))

    def _load_state(self, directory: Path) -> None:
        unit = directory / _UNIT_FILE
        if unit.exists():
            state = json.loads(unit.read_text())
            self.model = (PooledWeights if "pooled" in state else UnitWeights).from_state(state)
        else:
            self.model = load_sklearn(directory / MODEL_FILE)
        self.used = json.loads((directory / _USED_FILE).read_text())


class TextCombined(Combined):
    spec = DetectorSpec("text_combined", "leakray", (C.COMPLETIONS,), "black box", "composite", True,
                        "logistic regression, unit-weighted or pooled average (chosen on the shadow) over what "
                        "text gives: CodeBLEU/edit/pass summaries, semantic summaries, gt_match and cdd, and the "
                        "memory probes' statistics")
    defaults = {"groups": list(TEXT_GROUPS), "C": 1.0, "folds": 4, "combiner": "auto", "margin": 0.05}
    known_groups = TEXT_GROUPS
    pools_readings_only = True
    simplest_within_one_se = True
