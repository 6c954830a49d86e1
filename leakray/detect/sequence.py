"""CNN, LSTM and Transformer over token sequences of completion and reference (the CGMIA
paper's §4.4 deep baselines: no expert features, the network learns its own).

Input: one row per completion, ``reference tokens [SEP] completion tokens``, each side cut
to ``max_len`` tokens. Tokens are leakray's language-agnostic code tokens
(``leakray.features.expert.code_tokens``) hashed (CRC32) into ``vocab`` ids, so the
tokenizer needs no fitting and is the same for shadow and target. A task's score is the
mean member probability over its k completions.

Training: the paper keeps 40% of the shadow as validation; the weights of the epoch with
the lowest validation loss are kept, and the decision threshold is chosen on the
validation tasks' scores. The paper trains these "with CGMIA's epochs and learning rate"
(50 epochs, 1e-4); the defaults here are small (``epochs`` 10, ``lr`` 1e-3, width 32,
``max_len`` 64 tokens a side) so a
164-task demo stays within minutes on two CPU cores. Seeded (init and batch order).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from leakray.detect.base import DetectorSpec, HeldoutLearned, labels
from leakray.detect.datafiles import load_tensors, save_tensors
from leakray.errors import BadInput
from leakray.features.expert import code_tokens
from leakray.models.kernels import adam
from leakray.schema import C

PAD, SEP = 0, 1
_WEIGHTS_FILE = "weights.safetensors"


def token_ids(text: str, vocab: int, max_len: int) -> list[int]:
    return [2 + zlib.crc32(t.encode("utf-8")) % (vocab - 2) for t in code_tokens(text)[:max_len]]


def encode(table: pa.Table, vocab: int, max_len: int) -> tuple[np.ndarray, int]:
    """[n*k, 2*max_len+1] int64 (task-major, right-padded) and k."""
    comps = table.column(C.COMPLETIONS).to_pylist()
    refs = table.column(C.REFERENCE).to_pylist()
    ks = {len(c) for c in comps if c is not None}
    for i, (c, r) in enumerate(zip(comps, refs)):
        if c is None or r is None or not c or any(s is None for s in c):
            raise BadInput("null or empty value", row=i, field=C.COMPLETIONS if r is not None else C.REFERENCE)
    if len(ks) != 1:
        raise BadInput(f"rows hold different numbers of completions {sorted(ks)}", field=C.COMPLETIONS)
    k = ks.pop()
    out = np.zeros((len(comps) * k, 2 * max_len + 1), np.int64)
    for i, (cs, r) in enumerate(zip(comps, refs)):
        ref = token_ids(r, vocab, max_len) + [SEP]
        for j, c in enumerate(cs):
            ids = ref + token_ids(c, vocab, max_len)
            out[i * k + j, :len(ids)] = ids
    return out, k


def _masked_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).float()
    return (h * m).sum(1) / m.sum(1).clamp(min=1.0)


class _CNN(nn.Module):
    def __init__(self, vocab: int, width: int, max_len: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, width, padding_idx=PAD)
        self.conv = nn.Conv1d(width, 2 * width, 5, padding=2)
        self.out = nn.Linear(2 * width, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(self.emb(ids).transpose(1, 2))).transpose(1, 2)
        h = h.masked_fill((ids == PAD).unsqueeze(-1), float("-inf")).amax(1)  # max over real tokens
        return self.out(h)


class _LSTM(nn.Module):
    def __init__(self, vocab: int, width: int, max_len: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, width, padding_idx=PAD)
        self.rnn = nn.LSTM(width, width, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * width, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(ids))
        return self.out(_masked_mean(h, ids != PAD))


class _Transformer(nn.Module):
    def __init__(self, vocab: int, width: int, max_len: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, width, padding_idx=PAD)
        self.pos = nn.Embedding(2 * max_len + 1, width)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=2 * width, dropout=0.1,
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.out = nn.Linear(width, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        pad = ids == PAD
        h = self.enc(self.emb(ids) + self.pos(pos), src_key_padding_mask=pad)
        return self.out(_masked_mean(h, ~pad))


class SequenceModel(HeldoutLearned):
    net: ClassVar[type[nn.Module]]
    defaults = {"val_share": 0.4, "vocab": 4096, "max_len": 64, "width": 32, "epochs": 10, "lr": 1e-3,
                "batch_size": 32}

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.model: nn.Module | None = None

    def _build(self) -> nn.Module:
        p = self.params
        return type(self).net(int(p["vocab"]), int(p["width"]), int(p["max_len"]))

    def _train(self, shadow: pa.Table, train_idx: np.ndarray, val_idx: np.ndarray) -> None:
        p = self.params
        init_seed, order_seed = (int(v) for v in np.random.SeedSequence([self.seed, 19]).generate_state(2))
        xs, ys = [], []
        for idx in (train_idx, val_idx):
            part = shadow.take(idx)
            x, k = encode(part, int(p["vocab"]), int(p["max_len"]))
            xs.append(torch.from_numpy(x))
            ys.append(torch.from_numpy(np.repeat(labels(part, "shadow split").astype(np.int64), k)))
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG alone
            torch.manual_seed(init_seed)
            model = self._build()
            gen = torch.Generator().manual_seed(order_seed)
            opt = adam(model.parameters(), lr=float(p["lr"]))
            loss_fn = nn.CrossEntropyLoss()
            best, best_state, history = float("inf"), None, []
            for epoch in range(int(p["epochs"])):
                model.train()
                perm = torch.randperm(len(ys[0]), generator=gen)
                for s in range(0, len(perm), int(p["batch_size"])):
                    b = perm[s:s + int(p["batch_size"])]
                    loss = loss_fn(model(xs[0][b]), ys[0][b])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                model.eval()
                with torch.inference_mode():
                    val = float(loss_fn(model(xs[1]), ys[1]))
                history.append(val)
                if val < best:  # keep the epoch with the lowest validation loss
                    best, best_state = val, {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(best_state)
        self.model = model.eval()
        self.info.update(val_loss=history, kept_epoch=int(np.argmin(history)))

    def score(self, table: pa.Table) -> np.ndarray:
        if self.model is None:
            raise BadInput(f"{self.spec.name}: fit (or load) the detector before scoring")
        x, k = encode(table, int(self.params["vocab"]), int(self.params["max_len"]))
        out = []
        with torch.inference_mode():
            for s in range(0, len(x), 256):
                out.append(torch.softmax(self.model(torch.from_numpy(x[s:s + 256])), 1)[:, 1])
        p = torch.cat(out).double().numpy() if out else np.zeros(0)
        return p.reshape(table.num_rows, k).mean(axis=1)

    def _save_state(self, directory: Path) -> None:
        save_tensors(self.model.state_dict(), directory / _WEIGHTS_FILE)

    def _load_state(self, directory: Path) -> None:
        self.model = self._build()
        self.model.load_state_dict(load_tensors(directory / _WEIGHTS_FILE))
        self.model.eval()


def _spec(name: str, what: str) -> DetectorSpec:
    return DetectorSpec(name, f"the CGMIA paper §4.4 ({what} baseline)", (C.COMPLETIONS, C.REFERENCE), "black box",
                        "learned", True, f"{what} over hashed code tokens of reference [SEP] completion, mean over k")


class CNN(SequenceModel):
    net, spec = _CNN, _spec("cnn", "CNN")


class LSTM(SequenceModel):
    net, spec = _LSTM, _spec("lstm", "LSTM")


class Transformer(SequenceModel):
    net, spec = _Transformer, _spec("transformer", "Transformer")
