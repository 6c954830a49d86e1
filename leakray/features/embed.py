"""CGMIA's sliding-window code embeddings: [CLS] of each <=510-token window, averaged.

Works for BERT-style (MiniLM) and RoBERTa-style (microsoft/codebert-base) encoders:
the window is wrapped in the tokenizer's own start/end specials (cls/sep, or bos/eos).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from leakray.errors import BadInput
from leakray.schema import C

# RoBERTa-family position ids start after padding_idx, so they lose pad_token_id + 1 slots.
_OFFSET_POSITION_MODELS = ("roberta", "xlm-roberta", "camembert", "longformer")


def windows(n_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) windows of <= max_tokens, every stride tokens, the last one reaching the end."""
    spans = [(0, min(n_tokens, max_tokens))]
    start = 0
    while start + max_tokens < n_tokens:
        start += stride
        spans.append((start, min(n_tokens, start + max_tokens)))
    return spans


class SlidingWindowEmbedder:
    """Embed texts as the mean over windows of the last layer's [CLS] state.

    ``batch_size`` counts windows (not texts): windows of all texts in one ``embed``
    call are length-sorted and batched together, so padding stays small.
    Threads: uses whatever ``torch.set_num_threads`` the caller set.
    """

    def __init__(self, model_name_or_path: str, device: str = "cpu", max_tokens: int = 510,
                 stride: int = 256, batch_size: int = 32, dtype: Any = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if not 0 < stride <= max_tokens:
            raise BadInput(f"need 0 < stride <= max_tokens, got stride={stride}, max_tokens={max_tokens}")
        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        from leakray.models.host import load_dtype

        if dtype is None:  # the checkpoint's own; float32 on a CPU for a 16-bit one (load_dtype says why)
            dtype = load_dtype("auto", str(model_name_or_path), torch.device(device).type)
        self.model = AutoModel.from_pretrained(model_name_or_path, dtype=dtype).to(device).eval()
        self.device, self.max_tokens, self.stride, self.batch_size = device, max_tokens, stride, batch_size
        self.name = str(model_name_or_path)
        tok = self.tokenizer
        self.cls_id = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
        self.sep_id = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
        if self.cls_id is None or self.sep_id is None:
            raise BadInput(f"tokenizer of {model_name_or_path} has no cls/bos or sep/eos token")
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.sep_id
        cfg = self.model.config
        limit = getattr(cfg, "max_position_embeddings", None)
        if limit is not None and getattr(cfg, "model_type", "") in _OFFSET_POSITION_MODELS:
            limit -= (cfg.pad_token_id or 0) + 1
        if limit is not None and max_tokens + 2 > limit:
            raise BadInput(f"max_tokens={max_tokens} + 2 specials exceeds the model's {limit} positions")
        self._torch = torch

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def _chunks(self, texts: Sequence[str]) -> tuple[list[list[int]], np.ndarray]:
        ids = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        chunks, owner = [], []
        for i, toks in enumerate(ids):
            for s, e in windows(len(toks), self.max_tokens, self.stride):
                chunks.append([self.cls_id, *toks[s:e], self.sep_id])
                owner.append(i)
        return chunks, np.asarray(owner, dtype=np.int64)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), dim] float32. An empty text is embedded as ``[CLS][SEP]``."""
        torch = self._torch
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise BadInput(f"expected a string, got {type(t).__name__}", row=i)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return out
        chunks, owner = self._chunks(texts)
        cls = np.zeros((len(chunks), self.dim), dtype=np.float32)
        order = np.argsort([len(c) for c in chunks], kind="stable")
        with torch.inference_mode():
            for b in range(0, len(order), self.batch_size):
                idx = order[b: b + self.batch_size]
                width = max(len(chunks[j]) for j in idx)
                input_ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                for r, j in enumerate(idx):
                    input_ids[r, : len(chunks[j])] = torch.tensor(chunks[j])
                    mask[r, : len(chunks[j])] = 1
                hidden = self.model(input_ids=input_ids.to(self.device),
                                    attention_mask=mask.to(self.device)).last_hidden_state
                cls[idx] = hidden[:, 0].float().cpu().numpy()
        np.add.at(out, owner, cls)
        out /= np.bincount(owner, minlength=len(texts))[:, None]
        return out


def embed_batch(batch: Mapping[str, Any], embedder: SlidingWindowEmbedder, k: int) -> dict[str, Any]:
    """Add C.GEN_EMBEDDING (k*d floats, row-major k x d) and C.REF_EMBEDDING (d floats).

    Completions and references of the whole batch go through one ``embed`` call so
    windows are batched across rows. New columns are lists of 1-D float32 arrays.
    """
    if hasattr(batch, "to_pydict"):
        batch = batch.to_pydict()
    for name in (C.COMPLETIONS, C.REFERENCE):
        if name not in batch:
            raise BadInput("batch lacks column", field=name)
    comps = [list(c) if c is not None else None for c in batch[C.COMPLETIONS]]
    refs = list(batch[C.REFERENCE])
    for i, c in enumerate(comps):
        if c is None or len(c) != k:
            raise BadInput(f"expected {k} completions, got {None if c is None else len(c)}",
                           row=i, field=C.COMPLETIONS)
    n = len(refs)
    texts = [t for c in comps for t in c] + refs
    vecs = embedder.embed(texts)
    d = vecs.shape[1]
    gen = vecs[: n * k].reshape(n, k * d)
    out = dict(batch)
    out[C.GEN_EMBEDDING] = list(gen)
    out[C.REF_EMBEDDING] = list(vecs[n * k:])
    return out


class EmbedBatchFn:
    """Callable for an actor pool (e.g. Ray Data ``map_batches(EmbedBatchFn, fn_constructor_kwargs=...)``):
    loads the encoder once per actor, then ``embed_batch`` per batch."""

    def __init__(self, model_name_or_path: str, k: int, device: str = "cpu", num_threads: int | None = None,
                 **embedder_kwargs: Any):
        if num_threads is not None:
            import torch

            torch.set_num_threads(num_threads)
        self.k = k
        self.embedder = SlidingWindowEmbedder(model_name_or_path, device=device, **embedder_kwargs)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return embed_batch(batch, self.embedder, self.k)
