"""AdvPrompt-MIA: membership from how stable a model's completion stays under semantics-
preserving prompt perturbations (the 11 variants of ``leakray.perturb``).

Features (27, paper §IV-B1), per task:
- ``sim_base``, ``sim_<slot>`` x11: cosine similarity between the mean-pooled encoder
  embedding of the reference continuation and that of the unperturbed completion / of
  each perturbed completion; then ``sim_mean``, ``sim_std`` over those 12;
- ``ppl_<slot>`` x11: (PPL(perturbed completion) - PPL(unperturbed)) / PPL(unperturbed);
  then ``ppl_mean``, ``ppl_std`` over those 11.

Missing variants (a kind that does not apply, or a variant whose reference failed the
sandbox check) are explicit: ``adv_mask`` [n, 11] is False there. Their two features are
NaN in ``feature_matrix``; the summary statistics use present entries only; before the MLP
a missing slot's feature is imputed with the same row's mean of its group (so it moves
neither that row's mean nor its ranking among the row's other slots), and a row with no
perturbed variant at all gets relative perplexity 0 (no change). ``mask_features=True``
appends the 11 presence flags (38 inputs) for callers that want the classifier to see them.

Classifier (§IV-B2, §V-D): 27 -> 512 -> 512 -> 512 -> 2, ReLU and dropout after each hidden
layer, cross-entropy, Adam lr 1e-3 without weight decay, 25 epochs, shuffled batches of 4.
Not in the paper and chosen here: dropout 0.2 (the rate is not given) and a StandardScaler
fitted on training rows only (relative perplexities are unbounded; unscaled, one outlier
saturates the first layer).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from leakray.detect.datafiles import load_tensors, read_meta, save_tensors, write_meta
from leakray.errors import BadInput
from leakray.models.host import runnable_device
from leakray.models.kernels import adam
from leakray.perturb.core import SLOTS, slot_name

FORMAT_VERSION = 2  # 2: weights in safetensors (1: torch pickles)
N_VARIANTS = len(SLOTS)  # 11
SLOT_NAMES = tuple(slot_name(k, i) for k, i in SLOTS)
FEATURE_NAMES = (("sim_base",) + tuple(f"sim_{s}" for s in SLOT_NAMES) + ("sim_mean", "sim_std")
                 + tuple(f"ppl_{s}" for s in SLOT_NAMES) + ("ppl_mean", "ppl_std"))
PERPLEXITY_FEATURES = tuple(f for f in FEATURE_NAMES if f.startswith("ppl_"))  # what text alone cannot give
N_FEATURES = len(FEATURE_NAMES)  # 27
_SIM = slice(0, 12)  # sim_base + 11 slots
_PPL = slice(14, 25)  # 11 relative perplexities
_CONFIG_FILE, _WEIGHTS_FILE = "advprompt.json", "weights.safetensors"
ARRAY_KEYS = ("ref", "base", "adv", "base_ppl", "adv_ppl", "adv_mask")


@dataclass
class AdvPromptConfig:
    hidden: tuple[int, ...] = (512, 512, 512)
    dropout: float = 0.2
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 4
    epochs: int = 25
    standardize: bool = True
    mask_features: bool = False
    drop_features: tuple[str, ...] = ()  # RQ2 ablation: feature names left out
    device: str = "cpu"

    def __post_init__(self):
        self.hidden = tuple(int(h) for h in self.hidden)
        self.drop_features = tuple(self.drop_features)
        unknown = set(self.drop_features) - set(FEATURE_NAMES)
        if unknown:
            raise BadInput(f"AdvPromptConfig: unknown features {sorted(unknown)} (see FEATURE_NAMES)")
        if len(self.drop_features) == N_FEATURES and not self.mask_features:
            raise BadInput("AdvPromptConfig: every feature dropped")
        if not 0.0 <= self.dropout < 1.0:
            raise BadInput("AdvPromptConfig: dropout must be in [0, 1)")
        for name in ("batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise BadInput(f"AdvPromptConfig: {name} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hidden"], d["drop_features"] = list(self.hidden), list(self.drop_features)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "AdvPromptConfig":
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise BadInput(f"AdvPromptConfig: unknown keys {sorted(unknown)}")
        return cls(**d)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of [..., d] arrays; 0 where either vector is all zeros."""
    num = (a * b).sum(-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def _check_arrays(arrays: Mapping[str, np.ndarray]) -> int:
    missing = [k for k in ARRAY_KEYS if k not in arrays]
    if missing:
        raise BadInput(f"advprompt arrays lack {missing} (need {list(ARRAY_KEYS)})")
    ref, base, adv = (np.asarray(arrays[k]) for k in ("ref", "base", "adv"))
    n = len(ref)
    want = {"ref": (n, None), "base": (n, None), "adv": (n, N_VARIANTS, None), "base_ppl": (n,),
            "adv_ppl": (n, N_VARIANTS), "adv_mask": (n, N_VARIANTS)}
    d = ref.shape[1] if ref.ndim == 2 else None
    for key, shape in want.items():
        got = np.asarray(arrays[key]).shape
        shape = tuple(d if s is None else s for s in shape)
        if got != shape:
            raise BadInput(f"advprompt array {key!r} has shape {got}, expected {shape}", field=key)
    base_ppl = np.asarray(arrays["base_ppl"], dtype=np.float64)
    bad = ~(np.isfinite(base_ppl) & (base_ppl > 0))
    if bad.any():
        raise BadInput(f"unperturbed perplexity must be finite and > 0, got {base_ppl[bad][0]}",
                       row=int(np.flatnonzero(bad)[0]), field="base_ppl")
    mask = np.asarray(arrays["adv_mask"], dtype=bool)
    adv_ppl = np.asarray(arrays["adv_ppl"], dtype=np.float64)
    bad = mask & ~np.isfinite(adv_ppl)
    if bad.any():
        raise BadInput("non-finite perplexity of a present variant", row=int(np.flatnonzero(bad.any(1))[0]),
                       field="adv_ppl")
    return n


def feature_matrix(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(features [n, 27] with NaN at missing variants, present [n, 11] bool)."""
    n = _check_arrays(arrays)
    ref = np.asarray(arrays["ref"], dtype=np.float64)
    base = np.asarray(arrays["base"], dtype=np.float64)
    adv = np.asarray(arrays["adv"], dtype=np.float64)
    present = np.asarray(arrays["adv_mask"], dtype=bool)
    base_ppl = np.asarray(arrays["base_ppl"], dtype=np.float64)
    adv_ppl = np.asarray(arrays["adv_ppl"], dtype=np.float64)

    sims = np.concatenate([_cosine(ref, base)[:, None], _cosine(ref[:, None, :], adv)], axis=1)  # [n, 12]
    sims[:, 1:][~present] = np.nan
    rel = np.where(present, (adv_ppl - base_ppl[:, None]) / base_ppl[:, None], np.nan)  # [n, 11]
    any_adv = present.any(1)
    with np.errstate(invalid="ignore"):
        rel_mean = np.where(any_adv, np.nanmean(np.where(any_adv[:, None], rel, 0.0), axis=1), 0.0)
        rel_std = np.where(any_adv, np.nanstd(np.where(any_adv[:, None], rel, 0.0), axis=1), 0.0)
    x = np.concatenate([sims, np.nanmean(sims, 1, keepdims=True), np.nanstd(sims, 1, keepdims=True),
                        rel, rel_mean[:, None], rel_std[:, None]], axis=1)
    assert x.shape == (n, N_FEATURES)
    return x, present


def impute(x: np.ndarray) -> np.ndarray:
    """Missing per-slot features -> the row's mean of that group (relative perplexity 0 when a row
    has no perturbed variant at all). Summary columns are already over present entries."""
    x = x.copy()
    for group, mean_col in ((_SIM, 12), (_PPL, 25)):
        block = x[:, group]  # a view: filled in place
        fill = np.where(np.isfinite(x[:, mean_col]), x[:, mean_col], 0.0)
        missing = ~np.isfinite(block)
        block[missing] = np.broadcast_to(fill[:, None], block.shape)[missing]
    return x


def _seeds(seed: int) -> tuple[int, int]:
    a, b = np.random.SeedSequence(int(seed)).generate_state(2)
    return int(a), int(b)


def _mlp(in_dim: int, cfg: AdvPromptConfig) -> nn.Sequential:
    layers, prev = [], in_dim
    for h in cfg.hidden:
        layers += [nn.Linear(prev, h), nn.ReLU(), nn.Dropout(cfg.dropout)]
        prev = h
    layers.append(nn.Linear(prev, 2))
    return nn.Sequential(*layers)


class AdvPromptDetector:
    def __init__(self, config: AdvPromptConfig, seed: int, mean: np.ndarray, scale: np.ndarray):
        self.config, self.seed = config, int(seed)
        self.keep = np.array([name not in config.drop_features for name in FEATURE_NAMES])
        self.mean = np.asarray(mean, dtype=np.float64)
        self.scale = np.asarray(scale, dtype=np.float64)
        self.history: list[dict[str, float]] = []
        self.n_train = 0
        init_seed, _ = _seeds(seed)
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG alone
            torch.manual_seed(init_seed)
            self.net = _mlp(self.in_dim, config)
        self.net.to(config.device)

    @property
    def in_dim(self) -> int:
        return int(self.keep.sum()) + N_VARIANTS * self.config.mask_features

    def inputs(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """The MLP's input [n, in_dim]: features imputed, ablated, scaled (+ presence flags)."""
        x, present = feature_matrix(arrays)
        x = impute(x)[:, self.keep]
        if self.config.standardize:
            x = (x - self.mean) / self.scale
        if self.config.mask_features:
            x = np.concatenate([x, present.astype(np.float64)], axis=1)
        return x.astype(np.float32)

    def predict_proba(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Member probability per row, float64 [n] (from the float64 log-odds)."""
        from scipy.special import expit  # no overflow warning at the large margins these nets reach

        return expit(self.predict_log_odds(arrays))

    def predict_log_odds(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """log P(member) - log P(non-member) per row, float64 [n]: what the detectors rank by.
        The classifier is trained to near-zero loss on tens of rows, so on new rows its margins
        reach 100 and more; its probability rounds to exactly 1.0 past a margin of ~17 in
        float32 (~37 in float64): on the demo's target a third of the tasks tied there, their
        order lost, and TPR at 5% FPR could not be read. The margin keeps that order."""
        x = torch.as_tensor(self.inputs(arrays), device=self.config.device)
        self.net.eval()
        with torch.inference_mode():
            z = self.net(x).double()
        return (z[:, 1] - z[:, 0]).cpu().numpy()

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_tensors(self.net.state_dict(), directory / _WEIGHTS_FILE)
        meta = {"format_version": FORMAT_VERSION, "config": self.config.to_dict(), "seed": self.seed,
                "mean": self.mean.tolist(), "scale": self.scale.tolist(), "n_train": self.n_train,
                "history": self.history, "features": list(FEATURE_NAMES)}
        return write_meta(directory, _CONFIG_FILE, meta)

    @classmethod
    def load(cls, directory: str | Path, device: str | None = None) -> "AdvPromptDetector":
        directory = Path(directory)
        meta = read_meta(directory, _CONFIG_FILE, "advprompt detector")
        if meta.get("format_version") != FORMAT_VERSION or meta.get("features") != list(FEATURE_NAMES):
            raise BadInput(f"advprompt format {meta.get('format_version')!r} / features differ from this version",
                           path=str(directory / _CONFIG_FILE))
        cfg = dict(meta["config"])
        # trained on a GPU, scored here (on the CPU where this process has no GPU)
        cfg["device"] = runnable_device(device if device is not None else cfg["device"])
        det = cls(AdvPromptConfig.from_dict(cfg), meta["seed"], np.array(meta["mean"]), np.array(meta["scale"]))
        det.net.load_state_dict(load_tensors(directory / _WEIGHTS_FILE))
        det.net.to(det.config.device)
        det.n_train, det.history = int(meta["n_train"]), list(meta["history"])
        return det


def fit(arrays: Mapping[str, np.ndarray], config: AdvPromptConfig | None = None, seed: int = 0) -> AdvPromptDetector:
    """Train on labelled rows (``arrays["member"]`` 0/1); the caller has split by task."""
    config = config or AdvPromptConfig()
    n = _check_arrays(arrays)
    y = np.asarray(arrays.get("member", []))
    if len(y) != n:
        raise BadInput(f"member has {len(y)} rows, arrays have {n}", field="member")
    bad = ~np.isin(y, (0, 1))
    if bad.any():
        raise BadInput(f"training rows need member 0/1, got {y[bad][0]}", row=int(np.flatnonzero(bad)[0]),
                       field="member")
    if len(np.unique(y)) < 2:
        raise BadInput("training rows hold one class only", field="member")
    keep = np.array([name not in config.drop_features for name in FEATURE_NAMES])
    x = impute(feature_matrix(arrays)[0])[:, keep]
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0  # a constant column stays 0 after centring
    if not config.standardize:
        mean, scale = np.zeros_like(mean), np.ones_like(scale)
    det = AdvPromptDetector(config, seed, mean, scale)
    det.n_train = n
    xt = torch.as_tensor(det.inputs(arrays), device=config.device)
    yt = torch.as_tensor(y.astype(np.int64), device=config.device)
    _, order_seed = _seeds(seed)
    gen = torch.Generator().manual_seed(order_seed)
    opt = adam(det.net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    with torch.random.fork_rng(devices=[]):  # dropout masks drawn from the detector's seed
        torch.manual_seed(order_seed)
        det.net.train()
        for epoch in range(config.epochs):
            perm = torch.randperm(n, generator=gen).to(config.device)
            total = 0.0
            for s in range(0, n, config.batch_size):
                idx = perm[s:s + config.batch_size]
                loss = loss_fn(det.net(xt[idx]), yt[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
            det.history.append({"epoch": epoch, "loss": total / n})
    det.net.eval()
    return det


def graybox_split(member: np.ndarray, known_fraction: float = 0.2, seed: int = 0,
                  balanced_test: bool = True, groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The paper's partial-knowledge setting (§V-A): the auditor knows ``known_fraction`` of
    the target's members and as many non-members (training rows); the rest is scored (test
    rows), balanced the same way unless ``balanced_test`` is False. Rows with member -1
    (unknown) are in neither. Returns (train indices, test indices), sorted.

    ``groups``: one key per row (`base.task_keys`); rows sharing a key (a benchmark's near-copies,
    `base.keyed_by_copies`) are known together or scored together, never one known and its copy
    scored: the detector would be scored on its own training text. The draw is over keys; with
    every key its own row it is the row-by-row draw, to the index."""
    member = np.asarray(member)
    if not 0.0 < known_fraction < 1.0:
        raise BadInput(f"known_fraction must be in (0, 1), got {known_fraction}")
    keys = np.arange(len(member)).astype(str) if groups is None else np.asarray(groups).astype(str)
    if len(keys) != len(member):
        raise BadInput(f"groups has {len(keys)} rows, member {len(member)}", field="task_id")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 8]))

    def units(label: int) -> list[np.ndarray]:  # a class's rows, one array per key, in a seeded order
        by_key: dict[str, list[int]] = {}
        for r in np.flatnonzero(member == label):
            by_key.setdefault(keys[r], []).append(r)
        listed = list(by_key.values())
        return [np.asarray(listed[i]) for i in rng.permutation(len(listed))]

    pos, neg = units(1), units(0)
    n_pos = sum(len(u) for u in pos)
    k = int(round(known_fraction * n_pos))

    def known(us: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The first units in order that make up k rows (a group that would overrun k waits), the rest."""
        take, rest, have = [], [], 0
        for u in us:
            if have + len(u) <= k:
                take.append(u)
                have += len(u)
            else:
                rest.append(u)
        return take, rest

    def rows(us: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(us) if us else np.zeros(0, dtype=np.int64)

    (train_pos, test_pos), (train_neg, test_neg) = known(pos), known(neg)
    n_neg = sum(len(u) for u in neg)
    train_pos, train_neg, test_pos, test_neg = rows(train_pos), rows(train_neg), rows(test_pos), rows(test_neg)
    if k < 1 or n_neg < k + 1 or n_pos - k < 1 or len(train_pos) < 1 or len(train_neg) < 1 or not len(test_pos):
        raise BadInput(f"gray-box split needs members and non-members to spare: {n_pos} members, "
                       f"{n_neg} non-members, {k} known", field="member")
    train = np.concatenate([train_pos, train_neg])
    if balanced_test:
        m = min(len(test_pos), len(test_neg))
        test_pos, test_neg = test_pos[:m], test_neg[:m]
    return np.sort(train), np.sort(np.concatenate([test_pos, test_neg]))


def take(arrays: Mapping[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
    """The rows ``idx`` of every array (keys of ARRAY_KEYS, member, task_id)."""
    return {k: np.asarray(v)[idx] for k, v in arrays.items() if k in ARRAY_KEYS + ("member", "task_id")}


def arrays_from_table(table, perplexities: bool = True) -> dict[str, np.ndarray]:
    """A collection's AdvPrompt columns as the detector's arrays (slot 0 = unperturbed).

    ``perplexities=False`` does not read them (the text-only variant, ``advprompt_text``, whose
    features leave them out: an endpoint that returns no log-probabilities has none): every
    present slot's perplexity is then a neutral 1, so the arrays pass the checks and the
    relative-perplexity features are 0 wherever they would be computed."""
    from leakray.detect.arrays import list_column
    from leakray.detect.base import task_keys
    from leakray.schema import C

    needed = (C.ADV_EMBEDDING, C.ADV_PERPLEXITY, C.ADV_KIND, C.REF_EMBEDDING) if perplexities else \
        (C.ADV_EMBEDDING, C.ADV_KIND, C.REF_EMBEDDING)
    for name in needed:
        if name not in table.column_names or table.column(name).null_count:
            raise BadInput("the collection has no AdvPrompt columns (columns.advprompt was off, or rows lack them)",
                           field=name)
    ref = list_column(table, C.REF_EMBEDDING)
    n, d = ref.shape
    emb = np.asarray(table.column(C.ADV_EMBEDDING).to_pylist(), dtype=np.float32).reshape(n, N_VARIANTS + 1, d)
    ppl = np.asarray(table.column(C.ADV_PERPLEXITY).to_pylist(), dtype=np.float64) if perplexities else \
        np.ones((n, N_VARIANTS + 1))
    kinds = np.asarray(table.column(C.ADV_KIND).to_pylist(), dtype=object)
    if not (kinds[:, 0] == "base").all():
        raise BadInput("slot 0 of every row must be the unperturbed prompt", field=C.ADV_KIND)
    mask = kinds[:, 1:] != ""
    return {"ref": ref, "base": emb[:, 0], "adv": emb[:, 1:], "base_ppl": ppl[:, 0],
            "adv_ppl": np.where(mask, ppl[:, 1:], np.nan), "adv_mask": mask,
            "member": np.asarray(table.column(C.MEMBER).to_pylist(), dtype=np.int8),
            "task_id": task_keys(table)}  # the task, or its near-copy group: the folds' unit


def cross_fit_log_odds(arrays: Mapping[str, np.ndarray], config: AdvPromptConfig | None = None, seed: int = 0,
                       n_folds: int = 4) -> np.ndarray:
    """Out-of-fold member log-odds (stratified folds of tasks, a near-copy group in one fold, seeded):
    where a decision threshold is chosen without scoring rows the detector was trained on."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    y = np.asarray(arrays["member"])
    n_folds = min(n_folds, int((y == 0).sum()), int((y == 1).sum()))
    if n_folds < 2:
        raise BadInput("cross-fitting needs at least 2 rows of each class", field="member")
    state = int(np.random.SeedSequence([int(seed), 3]).generate_state(1)[0])
    keys = np.asarray(arrays.get("task_id", np.arange(len(y)))).astype(str)
    if len(np.unique(keys)) == len(keys):  # one row a task, no near-copy groups: the folds as they always were
        folds = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=state).split(np.zeros(len(y)), y)
    else:  # a near-copy group's tasks in one fold (`base.keyed_by_copies`)
        folds = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=state).split(np.zeros(len(y)), y, keys)
    out = np.full(len(y), np.nan)
    for fit_idx, held_idx in folds:
        out[held_idx] = fit(take(arrays, fit_idx), config, seed).predict_log_odds(take(arrays, held_idx))
    return out
