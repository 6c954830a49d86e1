"""CGMIA: the shadow-model membership classifier (paper Table 1), done reproducibly.

Architecture
- completions: gen [n, k, d] -> channels d, sequence k -> frozen Conv1d(d, d, 3, pad 1)
  -> ReLU -> frozen Conv1d(d, d, 3, pad 1) -> AdaptiveAvgPool1d(1) -> [n, d]
- expert [n, 4k] -> drop train-constant columns -> StandardScaler (fit on training
  rows only) -> frozen Linear(4k', 2048)
- [ref d; gen d; expert 2048] -> Linear 1024 -> ReLU -> Linear 512 -> ReLU -> Linear 2,
  cross-entropy, Adam.

What differs from the published code (on purpose): frozen parts are drawn from a
recorded seed and saved with the detector (never re-drawn at load), the scaler sees
training rows only, and the caller splits by task. Because the frozen parts are fixed,
their outputs are computed once per fit and only the FFN runs per epoch.

Score: the member log-odds (``predict_log_odds``), not the probability: the FFN is trained to
near-zero loss on tens of rows, so on new rows float32's softmax rounds a tenth of the demo's
target tasks to exactly 1.0 and their order is lost; the log-odds keeps it (same model, same
AUC up to those ties; ``predict_proba`` is its float64 logistic).

Decision threshold: scores on a detector's own training rows are overfit (near
certain), and the target must not be used, so the cut is chosen on held-out shadow rows by
cross-fitting (``fit_thresholded``): k folds over the shadow's tasks (stratified by
label), one extra detector per fold with the same seed, each scoring the fold it did not
see; the rule (``leakray.evaluate.thresholds``) runs on these out-of-fold log-odds
and the detector trained on all shadow rows keeps the cut. Cross-fitting rather than a
held-out split because the shadow is small (tens of tasks per class in the demo): every
shadow row trains the final detector and every row also informs the cut. The fold
models see (k-1)/k of the rows, so their scores are slightly less confident than
the final detector's; the cost is k extra fits of the FFN per seed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from leakray.detect.arrays import list_column, scalar_column
from leakray.detect.datafiles import (join_state, load_arrays, load_tensors, read_meta, save_tensors, split_state,
                                      write_meta)
from leakray.errors import BadInput
from leakray.evaluate.thresholds import DEFAULT_RULE, ThresholdRule, choose_threshold
from leakray.models.host import runnable_device
from leakray.models.kernels import adam
from leakray.schema import C

FORMAT_VERSION = 3  # 3: threshold and out-of-fold scores are log-odds (2: probabilities; 1: torch pickles)
CROSS_FIT_FOLDS = 4
_ROW_KEYS = ("gen", "ref", "expert", "member", "task_id")
_CONFIG_FILE, _WEIGHTS_FILE, _SCALER_FILE = "cgmia.json", "weights.safetensors", "scaler.npz"


@dataclass
class CGMIAConfig:
    expert_proj_dim: int = 2048
    hidden: tuple[int, ...] = (1024, 512)
    conv_kernel: int = 3
    lr: float = 1e-4
    batch_size: int = 100
    epochs: int = 50
    use_ref: bool = True
    use_gen: bool = True
    use_expert: bool = True
    # Train-constant expert columns (e.g. the pass block of a benchmark without tests)
    # carry nothing and would reach the model unscaled on a target where they vary.
    drop_constant_expert: bool = True
    # Which expert blocks reach the model, in C.EXPERT_BLOCKS order (perplexity, CodeBLEU,
    # edit distance, pass): the RQ2 ablation turns blocks off with the semantic inputs kept.
    expert_blocks: tuple[bool, ...] = (True, True, True, True)
    device: str = "cpu"

    def __post_init__(self):
        self.hidden = tuple(int(h) for h in self.hidden)
        self.expert_blocks = tuple(bool(b) for b in self.expert_blocks)
        if len(self.expert_blocks) != len(C.EXPERT_BLOCKS):
            raise BadInput(f"CGMIAConfig: expert_blocks needs {len(C.EXPERT_BLOCKS)} flags "
                           f"({', '.join(C.EXPERT_BLOCKS)}), got {len(self.expert_blocks)}")
        if not (self.use_ref or self.use_gen or self.use_expert):
            raise BadInput("CGMIAConfig: at least one of use_ref/use_gen/use_expert must be on")
        if self.conv_kernel % 2 != 1:
            raise BadInput("CGMIAConfig: conv_kernel must be odd so the k axis keeps its length")
        for name in ("expert_proj_dim", "batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise BadInput(f"CGMIAConfig: {name} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        d["expert_blocks"] = list(self.expert_blocks)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CGMIAConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise BadInput(f"CGMIAConfig: unknown keys {sorted(unknown)}")
        return cls(**d)


def arrays_from_table(table: pa.Table) -> dict[str, np.ndarray]:
    """Collection -> gen [n,k,d], ref [n,d], expert [n,4k], member [n] (int8; -1 unknown), task_id [n]."""
    expert = list_column(table, C.EXPERT)
    if expert.shape[1] % 4 or expert.shape[1] == 0:
        raise BadInput(f"expert vector has {expert.shape[1]} entries, expected 4k", field=C.EXPERT)
    k = expert.shape[1] // 4
    ref = list_column(table, C.REF_EMBEDDING)
    d = ref.shape[1]
    gen = list_column(table, C.GEN_EMBEDDING, width=k * d).reshape(len(ref), k, d)
    member = scalar_column(table, C.MEMBER, dtype=np.int8)
    # the unit of the cross-fitted folds: the task, or its near-copy group (`base.task_keys`)
    return {"gen": gen, "ref": ref, "expert": expert, "member": member, "task_id": task_keys(table)}


def _shapes(arrays: Mapping[str, np.ndarray]) -> tuple[int, int, int, int]:
    try:
        gen, ref, expert = arrays["gen"], arrays["ref"], arrays["expert"]
    except KeyError as e:
        raise BadInput(f"arrays lack {e.args[0]!r} (use arrays_from_table)") from None
    n = len(ref)
    if gen.ndim != 3 or ref.ndim != 2 or expert.ndim != 2 or len(gen) != n or len(expert) != n:
        raise BadInput(f"bad array shapes gen {gen.shape}, ref {ref.shape}, expert {expert.shape}")
    if gen.shape[2] != ref.shape[1]:
        raise BadInput(f"gen embedding width {gen.shape[2]} != ref embedding width {ref.shape[1]}")
    return n, gen.shape[1], ref.shape[1], expert.shape[1]


class _Frozen(nn.Module):
    """The parts CGMIA never trains; drawn once from the detector's seed."""

    def __init__(self, d: int, n_expert: int, cfg: CGMIAConfig):
        super().__init__()
        pad = cfg.conv_kernel // 2
        self.conv = nn.Sequential(
            nn.Conv1d(d, d, cfg.conv_kernel, stride=1, padding=pad), nn.ReLU(),
            nn.Conv1d(d, d, cfg.conv_kernel, stride=1, padding=pad), nn.AdaptiveAvgPool1d(1),
        ) if cfg.use_gen else None
        self.expert = nn.Linear(n_expert, cfg.expert_proj_dim) if cfg.use_expert and n_expert else None
        self.use_ref = cfg.use_ref
        self.out_dim = d * cfg.use_ref + d * (self.conv is not None) + \
            cfg.expert_proj_dim * (self.expert is not None)
        self.requires_grad_(False)

    def forward(self, gen: torch.Tensor, ref: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        parts = []
        if self.use_ref:
            parts.append(ref)
        if self.conv is not None:
            parts.append(self.conv(gen.transpose(1, 2)).squeeze(-1))  # [n,k,d] -> [n,d,k] -> [n,d]
        if self.expert is not None:
            parts.append(self.expert(expert))
        return torch.cat(parts, dim=1)


def _head(in_dim: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers, prev = [], in_dim
    for h in hidden:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        prev = h
    layers.append(nn.Linear(prev, 2))
    return nn.Sequential(*layers)


def _tensor(v: Any) -> torch.Tensor:
    # numpy weights from a Ray return value are read-only; copy rather than alias them
    return v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v))


def _seeds(seed: int) -> tuple[int, int, int]:
    """Independent streams for frozen init, head init and batch order, all from one seed."""
    a, b, c = np.random.SeedSequence(int(seed)).generate_state(3)
    return int(a), int(b), int(c)


class CGMIADetector:
    """A trained (or freshly initialised) CGMIA classifier with everything needed to predict."""

    def __init__(self, config: CGMIAConfig, seed: int, k: int, d: int, expert_width: int,
                 expert_keep: np.ndarray, scaler_mean: np.ndarray, scaler_scale: np.ndarray):
        self.config, self.seed, self.k, self.d, self.expert_width = config, int(seed), k, d, expert_width
        self.expert_keep = np.asarray(expert_keep, dtype=bool)
        self.scaler_mean = np.asarray(scaler_mean, dtype=np.float64)
        self.scaler_scale = np.asarray(scaler_scale, dtype=np.float64)
        self.history: list[dict[str, float]] = []
        self.n_train = 0
        # the decision cut and how it was chosen (Threshold.to_dict()); None until chosen
        self.threshold: dict[str, Any] | None = None
        # the training rows' out-of-fold log-odds the cut was chosen on (fit_thresholded)
        self.oof: np.ndarray | None = None
        frozen_seed, head_seed, _ = _seeds(seed)
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG alone
            torch.manual_seed(frozen_seed)
            self.frozen = _Frozen(d, int(self.expert_keep.sum()), config)
            torch.manual_seed(head_seed)
            self.head = _head(self.frozen.out_dim, config.hidden)
        self.frozen.to(config.device).eval()
        self.head.to(config.device)

    # -- features ------------------------------------------------------------------
    def _check(self, arrays: Mapping[str, np.ndarray]) -> int:
        n, k, d, e = _shapes(arrays)
        if (k, d, e) != (self.k, self.d, self.expert_width):
            raise BadInput(f"arrays have k={k}, d={d}, expert={e}; detector was trained on "
                           f"k={self.k}, d={self.d}, expert={self.expert_width}")
        return n

    def _standardise(self, expert: np.ndarray) -> np.ndarray:
        return ((expert[:, self.expert_keep] - self.scaler_mean) / self.scaler_scale).astype(np.float32)

    @torch.inference_mode()
    def features(self, arrays: Mapping[str, np.ndarray], chunk: int = 1024) -> torch.Tensor:
        """Frozen-part outputs [n, in_dim] (the FFN's input)."""
        n = self._check(arrays)
        dev = self.config.device
        std = self._standardise(np.asarray(arrays["expert"], dtype=np.float64))
        out = []
        for s in range(0, n, chunk):
            out.append(self.frozen(
                torch.as_tensor(np.asarray(arrays["gen"][s:s + chunk], dtype=np.float32), device=dev),
                torch.as_tensor(np.asarray(arrays["ref"][s:s + chunk], dtype=np.float32), device=dev),
                torch.as_tensor(std[s:s + chunk], device=dev)))
        return torch.cat(out) if out else torch.zeros((0, self.frozen.out_dim), device=dev)

    def predict_proba(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Member probability per row, float64 [n] (the logistic of ``predict_log_odds``)."""
        from scipy.special import expit  # no overflow warning at the large margins these nets reach

        return expit(self.predict_log_odds(arrays))

    def predict_log_odds(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """log P(member) - log P(non-member) per row, float64 [n]: the score (module doc)."""
        x = self.features(arrays)
        self.head.eval()
        with torch.inference_mode():
            z = self.head(x).double()
        return (z[:, 1] - z[:, 0]).cpu().numpy()

    def predict(self, arrays: Mapping[str, np.ndarray], threshold: float | None = None) -> np.ndarray:
        """0/1 decisions at ``threshold``, by default the cut chosen on held-out shadow rows."""
        if threshold is None:
            if self.threshold is None:
                raise BadInput("this detector has no decision threshold: train it with fit_thresholded "
                               "(or pass threshold=)")
            threshold = self.threshold["value"]
        return (self.predict_log_odds(arrays) >= threshold).astype(np.int8)

    # -- persistence ---------------------------------------------------------------
    def state(self, numpy: bool = False) -> dict[str, Any]:
        """Everything needed to rebuild the detector; ``numpy=True`` gives weights as numpy
        arrays (Ray Train refuses torch tensors in a training function's return value)."""
        conv = (lambda t: t.detach().cpu().numpy()) if numpy else (lambda t: t.detach().cpu())
        return {
            "format_version": FORMAT_VERSION, "config": self.config.to_dict(), "seed": self.seed,
            "k": self.k, "d": self.d, "expert_width": self.expert_width,
            "expert_keep": self.expert_keep.tolist(), "n_train": self.n_train, "history": self.history,
            "threshold": self.threshold, "oof": None if self.oof is None else self.oof.tolist(),
            "scaler_mean": self.scaler_mean, "scaler_scale": self.scaler_scale,
            "frozen": {k: conv(v) for k, v in self.frozen.state_dict().items()},
            "head": {k: conv(v) for k, v in self.head.state_dict().items()},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], device: str | None = None) -> "CGMIADetector":
        if state.get("format_version") != FORMAT_VERSION:
            raise BadInput(f"CGMIA format {state.get('format_version')!r}, expected {FORMAT_VERSION}")
        cfg = dict(state["config"])
        cfg["device"] = runnable_device(device if device is not None else cfg["device"])
        det = cls(CGMIAConfig.from_dict(cfg), state["seed"], state["k"], state["d"],
                  state["expert_width"], np.asarray(state["expert_keep"], bool),
                  state["scaler_mean"], state["scaler_scale"])
        det.frozen.load_state_dict({k: _tensor(v) for k, v in state["frozen"].items()})
        det.head.load_state_dict({k: _tensor(v) for k, v in state["head"].items()})
        det.n_train, det.history = int(state["n_train"]), list(state["history"])
        det.threshold = state.get("threshold")  # absent in detectors saved before thresholds
        det.oof = None if state.get("oof") is None else np.asarray(state["oof"], dtype=np.float64)
        return det

    def save(self, directory: str | Path) -> Path:
        """Write config+seed (json), weights incl. frozen parts (safetensors), scaler (npz) to a directory:
        plain data, nothing that runs code when loaded."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        st = self.state()
        meta = {k: v for k, v in st.items() if k not in ("frozen", "head", "scaler_mean", "scaler_scale")}
        save_tensors(split_state({"frozen": st["frozen"], "head": st["head"]}), directory / _WEIGHTS_FILE)
        np.savez(directory / _SCALER_FILE, mean=self.scaler_mean, scale=self.scaler_scale)
        return write_meta(directory, _CONFIG_FILE, meta)

    @classmethod
    def load(cls, directory: str | Path, device: str | None = None) -> "CGMIADetector":
        directory = Path(directory)
        meta = read_meta(directory, _CONFIG_FILE, "CGMIA detector")
        weights = join_state(load_tensors(directory / _WEIGHTS_FILE), ("frozen", "head"))
        sc = load_arrays(directory / _SCALER_FILE)
        meta.update(scaler_mean=sc["mean"], scaler_scale=sc["scale"])
        meta.update(weights)
        return cls.from_state(meta, device=device)


def fit(train_arrays: Mapping[str, np.ndarray], config: CGMIAConfig | None = None, seed: int = 0,
        progress: bool = True, report: Callable[[int, dict[str, float]], None] | None = None
        ) -> CGMIADetector:
    """Train CGMIA on labelled rows (member 0/1). The caller has already split by task."""
    from sklearn.preprocessing import StandardScaler
    from tqdm.auto import tqdm

    config = config or CGMIAConfig()
    n, k, d, e = _shapes(train_arrays)
    y = np.asarray(train_arrays.get("member", []))
    if len(y) != n:
        raise BadInput(f"member has {len(y)} rows, arrays have {n}", field=C.MEMBER)
    bad = ~np.isin(y, (0, 1))
    if bad.any():
        raise BadInput(f"training rows need member 0/1, got {y[bad][0]}", row=int(np.flatnonzero(bad)[0]),
                       field=C.MEMBER)
    if len(np.unique(y)) < 2:
        raise BadInput("training rows hold one class only", field=C.MEMBER)

    expert = np.asarray(train_arrays["expert"], dtype=np.float64)
    keep = (np.ptp(expert, axis=0) > 0) if config.drop_constant_expert else np.ones(e, bool)
    keep &= np.repeat(np.asarray(config.expert_blocks, bool), e // len(config.expert_blocks))
    if keep.any():
        scaler = StandardScaler().fit(expert[:, keep])  # training rows only
        mean, scale = scaler.mean_, scaler.scale_
    else:
        mean, scale = np.zeros(0), np.ones(0)
    det = CGMIADetector(config, seed, k, d, e, keep, mean, scale)
    if det.frozen.out_dim == 0:
        raise BadInput("nothing to train on: every expert column is constant and use_ref/use_gen are off")
    det.n_train = n

    x = det.features(train_arrays).clone()  # frozen outputs, once
    yt = torch.as_tensor(y.astype(np.int64), device=config.device)
    _, _, order_seed = _seeds(seed)
    gen = torch.Generator().manual_seed(order_seed)
    opt = adam(det.head.parameters(), lr=config.lr)
    loss_fn = nn.CrossEntropyLoss()
    det.head.train()
    bar = tqdm(range(config.epochs), desc=f"cgmia seed={seed}", disable=not progress, leave=False)
    for epoch in bar:
        perm = torch.randperm(n, generator=gen).to(config.device)
        total, correct = 0.0, 0
        for s in range(0, n, config.batch_size):
            idx = perm[s:s + config.batch_size]
            logits = det.head(x[idx])
            loss = loss_fn(logits, yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == yt[idx]).sum())
        metrics = {"epoch": epoch, "loss": total / n, "train_acc": correct / n}
        det.history.append(metrics)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}", acc=f"{metrics['train_acc']:.3f}")
        if report is not None:
            report(epoch, metrics)
    det.head.eval()
    return det


def _rows(arrays: Mapping[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    return {k: np.asarray(arrays[k])[idx] for k in _ROW_KEYS if k in arrays}


def cross_fit_log_odds(train_arrays: Mapping[str, np.ndarray], config: CGMIAConfig | None = None, seed: int = 0,
                       n_folds: int = CROSS_FIT_FOLDS) -> np.ndarray:
    """Out-of-fold member log-odds for the training rows: k folds by task (stratified
    by label, split seeded from ``seed``), each scored by a detector fitted with ``seed``
    on the other folds."""
    from sklearn.model_selection import StratifiedGroupKFold

    config = config or CGMIAConfig()
    n = _shapes(train_arrays)[0]
    y = np.asarray(train_arrays.get("member", []))
    if len(y) != n or not np.isin(y, (0, 1)).all():
        raise BadInput("cross-fitting needs member 0/1 on every training row", field=C.MEMBER)
    smallest = int(min((y == 0).sum(), (y == 1).sum()))
    if n_folds < 2 or smallest < n_folds:
        raise BadInput(f"cannot cross-fit {n_folds} folds: need n_folds >= 2 and at least n_folds rows of "
                       f"each class (smallest class has {smallest})", field=C.MEMBER)
    groups = train_arrays.get("task_id")
    groups = np.arange(n) if groups is None else np.asarray(groups).astype(str)
    fold_seed = int(np.random.SeedSequence([int(seed), 1]).generate_state(1)[0])
    split = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=fold_seed)
    proba = np.full(n, np.nan)
    for fit_idx, held_idx in split.split(np.zeros(n), y, groups):
        det = fit(_rows(train_arrays, fit_idx), config, seed, progress=False)
        proba[held_idx] = det.predict_log_odds(_rows(train_arrays, held_idx))
    return proba


def fit_thresholded(train_arrays: Mapping[str, np.ndarray], config: CGMIAConfig | None = None, seed: int = 0,
                    rule: str = DEFAULT_RULE, n_folds: int = CROSS_FIT_FOLDS, progress: bool = False,
                    report: Callable[[int, dict[str, float]], None] | None = None) -> CGMIADetector:
    """``fit`` on all training rows, plus a decision threshold chosen by ``rule`` on
    cross-fitted out-of-fold log-odds (see module doc); kept in ``det.threshold``.
    Fewer folds than ``n_folds`` when a class has fewer rows (at least 2 of each needed)."""
    rule = ThresholdRule(rule)  # refuse a bad rule before training
    det = fit(train_arrays, config, seed, progress=progress, report=report)
    y = np.asarray(train_arrays["member"])
    # a tiny shadow (a quick run) gets fewer folds rather than a late failure; recorded below
    n_folds = min(int(n_folds), int((y == 0).sum()), int((y == 1).sum()))
    det.oof = oof = cross_fit_log_odds(train_arrays, config, seed, n_folds)
    det.threshold = choose_threshold(
        y, oof, rule, chosen_on=f"shadow, out-of-fold ({n_folds}-fold cross-fit by task)").to_dict()
    return det


# -- registry entry ----------------------------------------------------------------------
from leakray.detect.base import Detector, DetectorSpec, FitContext, labels, task_keys  # noqa: E402  (base imports nothing from here)


class CGMIA(Detector):
    """Registry wrapper around ``CGMIADetector``: the threshold is cross-fitted on the
    shadow exactly as ``fit_thresholded`` does (same folds, same seed)."""

    spec = DetectorSpec("cgmia", "the CGMIA paper (Table 1)", (C.EXPERT, C.GEN_EMBEDDING, C.REF_EMBEDDING),
                        "sampled logprobs", "learned", True,
                        "frozen CNN over completion embeddings + reference embedding + projected expert "
                        "features -> FFN", fit="ray_train")
    defaults = {"config": {}, "folds": CROSS_FIT_FOLDS}
    # detectors built from CGMIA fits (cgmia_ensemble's members are CGMIA seeds): asked for
    # together, they are fitted together, every CGMIA seed once (``fit_group``)
    group = "cgmia"

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.config = CGMIAConfig.from_dict(self.params["config"])
        self.params["config"] = self.config.to_dict()
        self.model: CGMIADetector | None = None
        self._oof: tuple[np.ndarray, np.ndarray, str] | None = None

    @classmethod
    def fit_seeds(cls, shadow: pa.Table, seeds: Iterable[int], params: Mapping[str, Any] | None = None,
                  context: FitContext | None = None) -> list["CGMIA"]:
        """Every seed trained and thresholded (cross-fitted): as one Ray Train run when the
        protocol lends one (``context.train_seeds``), else in this process."""
        return cls.fit_group([cls.spec.name], shadow, seeds, {cls.spec.name: params or {}}, context)[cls.spec.name]

    # -- the CGMIA family: a member class says which CGMIA fits it is made of ----------------
    @classmethod
    def cgmia_fits(cls, params: Mapping[str, Any], seed: int) -> list[int]:
        """The CGMIA seeds (fitted with this detector's config and folds) its seed ``seed`` uses."""
        return [int(seed)]

    @classmethod
    def from_cgmia_fits(cls, models: list[CGMIADetector], shadow: pa.Table, seed: int,
                        params: Mapping[str, Any]) -> "CGMIA":
        return cls.wrap(models[0], int(cls(**params).params["folds"]))

    @classmethod
    def fit_group(cls, names: list[str], shadow: pa.Table, seeds: Iterable[int],
                  params: Mapping[str, Mapping[str, Any]], context: FitContext | None = None) -> dict[str, list]:
        """CGMIA and the detectors made of CGMIA fits, fitted together: every (config, folds,
        seed) any of them uses is trained and thresholded once (the ensemble of seed s reuses
        CGMIA's seeds s, s+1, ...: 35 fits for both at 5 seeds and 3 members, not 100), in one
        Ray Train run per config when the protocol lends one and CGMIA itself is asked for
        (an ensemble alone fits where it runs)."""
        from leakray.detect import registry

        ctx = context or FitContext()
        seeds = [int(s) for s in seeds]
        classes = {n: registry.detector_class(n) for n in names}
        protos = {n: c(**dict(params.get(n) or {})) for n, c in classes.items()}
        settings: dict[str, tuple[CGMIAConfig, int, set[int]]] = {}  # key -> (config, folds, seeds)
        uses: dict[str, dict[int, tuple[str, list[int]]]] = {}
        for n, proto in protos.items():
            key = json.dumps([proto.config.to_dict(), int(proto.params["folds"])], sort_keys=True)
            entry = settings.setdefault(key, (proto.config, int(proto.params["folds"]), set()))
            uses[n] = {s: (key, classes[n].cgmia_fits(proto.params, s)) for s in seeds}
            for _, member_seeds in uses[n].values():
                entry[2].update(member_seeds)
        on_ray = ctx.train_seeds is not None and any(c.spec.fit == "ray_train" for c in classes.values())
        fits: dict[tuple[str, int], CGMIADetector] = {}
        for key, (config, folds, need) in settings.items():
            need = sorted(need)
            if on_ray:
                models = ctx.train_seeds(shadow, config, need, storage_path=ctx.storage_path,
                                         threshold_rule=ctx.threshold_rule, threshold_folds=folds)
            else:
                arrays = arrays_from_table(shadow)
                models = [fit_thresholded(arrays, config, s, ctx.threshold_rule, folds, progress=ctx.progress)
                          for s in need]
            fits.update({(key, s): m for s, m in zip(need, models)})
        return {n: [classes[n].from_cgmia_fits([fits[(key, m)] for m in member_seeds], shadow, s,
                                               protos[n].params)
                    for s, (key, member_seeds) in uses[n].items()]
                for n in names}

    @classmethod
    def wrap(cls, model: CGMIADetector, folds: int = CROSS_FIT_FOLDS) -> "CGMIA":
        """A trained (and thresholded) ``CGMIADetector`` as a registry detector."""
        det = cls(config=model.config.to_dict(), folds=folds)
        det.model, det.seed, det.threshold_ = model, model.seed, model.threshold
        return det

    def fit(self, shadow: pa.Table, seed: int = 0) -> "CGMIA":
        self.seed = int(seed)
        self.model = fit(arrays_from_table(shadow), self.config, self.seed, progress=False)
        self._oof, self.threshold_ = None, None
        return self

    def heldout(self, shadow: pa.Table) -> tuple[np.ndarray, np.ndarray, str]:
        if self._oof is None:
            arrays = arrays_from_table(shadow)
            y = labels(shadow)
            folds = min(int(self.params["folds"]), int((y == 0).sum()), int((y == 1).sum()))
            oof = cross_fit_log_odds(arrays, self.config, self.seed, folds)
            self._oof = (y, oof, f"shadow, out-of-fold ({folds}-fold cross-fit by task)")
        return self._oof

    def threshold(self, shadow: pa.Table, rule: str = DEFAULT_RULE) -> dict[str, Any]:
        if self.threshold_ is not None and self.threshold_["rule"] == rule and self._oof is None:
            return self.threshold_  # cross-fitted with the model (``wrap`` of fit_thresholded's output)
        th = super().threshold(shadow, rule)
        self.model.threshold = th
        return th

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput("cgmia: fit (or load) the detector before scoring")
        return self.model.predict_log_odds(arrays_from_table(table))

    def _save_state(self, directory: Path) -> None:
        self.model.save(directory / "model")

    def _load_state(self, directory: Path) -> None:
        self.model = CGMIADetector.load(directory / "model")
