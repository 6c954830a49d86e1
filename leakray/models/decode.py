"""Batched decoding for the HF backend: many prompts, each with its own random stream, in one
KV-cached loop that drops a sequence the step it ends.

`model.generate` runs every row of a call until the *last* row stops: a task's k samples cost
k times its longest sample, and AdvPrompt's eleven greedy variants eleven times the longest
variant (in the demo the mean kept sample is 61 tokens, the mean longest of five 103). Here a
finished sequence leaves the batch (its KV cache rows are dropped), so the work is the tokens
actually generated; the prompt is encoded once and its cache copied for its n samples; and
many tasks share each forward pass.

What a result depends on is unchanged: each `Request` (one task's prompts) draws from its own
`torch.Generator`, seeded by the task, so its samples do not depend on which tasks share the
loop; batch-mates only change the floating point's last bits through padding (greedy tokens
on CPU in float32 were the same alone and batched: tests/test_decode.py). Sampling follows
transformers' warpers (temperature, then top-p keeping at least one token); the log-probs
recorded are of the raw, unwarped model, as `output_logits` gives them.

`bench_collect.py` keeps the comparison with `model.generate` side by side.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class Request:
    """One unit of work: prompts that share a random stream (one task's, or its variants)."""

    prompts: list[list[int]]  # token ids of each prompt (already cut to the context)
    n: int  # sequences per prompt (greedy: 1)
    greedy: bool
    seed: int
    max_new_tokens: int
    stops: list[str] = field(default_factory=list)  # generation ends once its text holds one


@dataclass
class Generated:
    ids: list[int]  # generated tokens, the ending token (EOS, or the one completing a stop) included
    logprobs: list[float]  # raw model log-prob of each


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' TopPLogitsWarper (min_tokens_to_keep=1) on [B, V] logits."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=False)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
    remove[..., -1:] = False
    return logits.masked_fill(remove.scatter(1, order, remove), -float("inf"))


def _growing_cache(reserve: int):
    """A DynamicCache whose layers write into buffers with room for ``reserve`` more positions
    after the prompt, instead of concatenating a copy of the whole cache on every step (which
    made the cache copies cost as much as the model's matrix products here)."""
    from transformers.cache_utils import DynamicCache

    try:
        from transformers.cache_utils import Cache, DynamicLayer
    except ImportError:  # transformers before cache layers: the plain cache (it concatenates)
        return DynamicCache()

    class Layer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                b, h, n, d = key_states.shape
                self._k = key_states.new_empty((b, h, n + reserve, d))
                self._v = value_states.new_empty((b, h, n + reserve, value_states.shape[-1]))
                self._n = 0
            n = key_states.shape[-2]
            self._k[:, :, self._n: self._n + n] = key_states
            self._v[:, :, self._n: self._n + n] = value_states
            self._n += n
            self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._n if self.is_initialized else 0

        def batch_select_indices(self, indices):
            if self.is_initialized:
                self._k, self._v = self._k[indices], self._v[indices]
                self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]

    cache = DynamicCache()
    Cache.__init__(cache, layer_class_to_replicate=Layer)
    return cache


class _Seq:
    __slots__ = ("req", "prompt", "ids", "logprobs")

    def __init__(self, req: int, prompt: int):
        self.req, self.prompt, self.ids, self.logprobs = req, prompt, [], []


def decode(model, requests: list[Request], *, pad_id: int, end_ids: set[int],
           detokenize: Callable[[list[int]], str], temperature: float = 1.0, top_p: float = 1.0,
           max_sequences: int = 96) -> list[list[list[Generated]]]:
    """For each request, for each prompt, its n `Generated` sequences. Requests are decoded
    together in chunks of at most ``max_sequences`` sequences (a request is never split)."""
    out: list[list[list[Generated]]] = [[[] for _ in r.prompts] for r in requests]
    for chunk in _chunks(requests, max_sequences):
        _decode_chunk(model, requests, chunk, out, pad_id, end_ids, detokenize, temperature, top_p)
    return out


def _chunks(requests: list[Request], max_sequences: int, slack: float = 1.25) -> list[list[int]]:
    """Requests grouped by prompt length: left padding to a chunk's longest prompt costs every
    other row of the chunk that many more cached positions on every step, so a chunk's
    longest prompt is at most ``slack`` times (+16 tokens) its shortest."""
    order = sorted(range(len(requests)), key=lambda i: max(map(len, requests[i].prompts)))
    chunks: list[list[int]] = []
    size, shortest = 0, 0
    for i in order:
        req = requests[i]
        need, lo, hi = len(req.prompts) * req.n, min(map(len, req.prompts)), max(map(len, req.prompts))
        if chunks and size + need <= max_sequences and hi <= slack * shortest + 16:
            chunks[-1].append(i)
            size, shortest = size + need, min(shortest, lo)
        else:
            chunks.append([i])
            size, shortest = need, lo
    return chunks


def _decode_chunk(model, requests, chunk, out, pad_id, end_ids, detokenize, temperature, top_p) -> None:
    device = next(model.parameters()).device
    rows = [(i, j) for i in chunk for j in range(len(requests[i].prompts))]
    prompts = [requests[i].prompts[j] for i, j in rows]
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    gens = {i: torch.Generator(device=device).manual_seed(requests[i].seed) for i in chunk}

    reserve = max(requests[i].max_new_tokens for i in chunk) + 1
    with torch.inference_mode():
        cache = _growing_cache(reserve)
        # only the last position's logits (a vocabulary row per prompt token would be wasted memory)
        params = inspect.signature(type(model).forward).parameters  # the class's (an instance may wrap it)
        keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        arg = "cache" if "cache" in params else "past_key_values"  # the argument's name before transformers 5
        first = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{arg: cache}, **keep_last)
        cache = _cache_of(first)
        # the prompt's cache, copied for each of its n sequences
        seqs, expand = [], []
        for r, (i, j) in enumerate(rows):
            for _ in range(requests[i].n):
                seqs.append(_Seq(i, j))
                expand.append(r)
        index = torch.tensor(expand, device=device)
        cache.batch_select_indices(index)
        logits = first.logits[index, -1]
        mask, next_pos = mask[index], pos[index, -1] + 1
        alive = list(range(len(seqs)))  # positions in the batch -> seqs
        while alive:
            chosen, logp = _choose(logits, [seqs[s] for s in alive], requests, gens, temperature, top_p)
            keep = []
            for b, (s, tok, lp) in enumerate(zip(alive, chosen.tolist(), logp.tolist())):
                seq = seqs[s]
                seq.ids.append(tok)
                seq.logprobs.append(lp)
                if not _ended(seq, tok, requests[seq.req], end_ids, detokenize):
                    keep.append(b)
            if len(keep) < len(alive):
                if not keep:
                    break
                sel = torch.tensor(keep, device=device)
                cache.batch_select_indices(sel)
                chosen, mask, next_pos = chosen[sel], mask[sel], next_pos[sel]
                alive = [alive[b] for b in keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            nxt = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                        use_cache=True, **{arg: cache})
            cache, logits, next_pos = _cache_of(nxt), nxt.logits[:, -1], next_pos + 1
    for seq in seqs:
        out[seq.req][seq.prompt].append(Generated(seq.ids, seq.logprobs))


def _cache_of(output):
    return output.cache if getattr(output, "cache", None) is not None else output.past_key_values


def _choose(logits: torch.Tensor, seqs: list[_Seq], requests: list[Request], gens: dict, temperature: float,
            top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each live sequence's next token (argmax, or drawn from its request's stream) and its raw log-prob."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logits.argmax(-1)
    by_req: dict[int, list[int]] = {}
    for b, seq in enumerate(seqs):
        if not requests[seq.req].greedy:
            by_req.setdefault(seq.req, []).append(b)
    if by_req:
        sampled = [b for bs in by_req.values() for b in bs]
        idx = torch.tensor(sampled, device=logits.device)
        probs = _top_p(logits[idx] / temperature, top_p).softmax(-1)
        at = 0
        for req, bs in by_req.items():
            draw = torch.multinomial(probs[at: at + len(bs)], 1, generator=gens[req]).squeeze(-1)
            chosen[torch.tensor(bs, device=logits.device)] = draw
            at += len(bs)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)


def _ended(seq: _Seq, tok: int, req: Request, end_ids: set[int], detokenize) -> bool:
    if tok in end_ids or len(seq.ids) >= req.max_new_tokens:
        return True
    if not req.stops:
        return False
    # a stop string that ends in the newest token lies within the last few tokens (every token
    # decodes to at least one character): decode only those, so a step costs the same at any length
    tail = detokenize(seq.ids[-(max(map(len, req.stops)) + 2):])
    return any(stop in tail for stop in req.stops)
