"""Batched decoding for the HF backend: many prompts, each with its own random stream, in one
KV-cached loop that drops a sequence the step it ends.

`model.generate` runs every row of a call until the *last* row stops: a task's k samples cost
k times its longest sample, and AdvPrompt's eleven greedy variants eleven times the longest
variant (in the demo the mean kept sample is 61 tokens, the mean longest of five 103). Here a
finished sequence leaves the batch (its KV cache rows are dropped), so the work is the tokens
actually generated; the prompt is encoded once and its cache copied for its n samples; and
many tasks share each forward pass; the first tokens a task's prompts share (its AdvPrompt
variants, a probe's cut points) are encoded once. Requests enter a pool of live sequences chunk
by chunk as room frees (`_Pool`), so steps stay full instead of draining each chunk to its
longest sequence, and each step's attention reads only the columns its rows use
(`leakray.models.ragged_attention`).

What a result depends on is unchanged: each `Request` (one task's prompts) draws from its own
`torch.Generator`, seeded by the task, so its samples do not depend on which tasks share the
loop; batch-mates only change the floating point's last bits through padding (greedy tokens
on CPU in float32 were the same alone and batched: tests/test_decode.py). Sampling follows
transformers' warpers (temperature, then top-p keeping at least one token); the log-probs
recorded are of the raw, unwarped model, as `output_logits` gives them.

`bench_collect.py` keeps the comparison with `model.generate` side by side.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
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

    @property
    def sequences(self) -> int:
        return len(self.prompts) * self.n


@dataclass
class Generated:
    ids: list[int]  # generated tokens, the ending token (EOS, or the one completing a stop) included
    logprobs: list[float]  # raw model log-prob of each


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' TopPLogitsWarper (min_tokens_to_keep=1) on [B, V] logits, to the bit.

    On the CPU the sort is numpy's (SIMD) in place of torch's: sorting a step's [40, 4096]
    logits took 11-15 ms with `torch.sort` and 0.4 ms with `np.sort`, and was a third of a
    sampled decoding step. The warper's own arithmetic then runs on the same sorted values, so
    the cumulative sums are the same floats. Their removed entries are a prefix of the
    ascending order (the cumulative sum never decreases), so no sort order is needed to place
    them: a token goes when its logit is below the smallest kept value. That holds unless the
    last removed value equals the first kept one (a tie across the cut, which only the sort's
    order of equal values decides) or a row holds NaN; such a batch takes the warper's way, as do
    logits on a GPU (whose sort is fast) and 16-bit logits (numpy has no bfloat16)."""
    if top_p >= 1.0:
        return logits
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and logits.dim() == 2 \
            and logits.numel():
        values = torch.from_numpy(np.sort(logits.detach().numpy(), axis=-1))
        remove = values.softmax(-1).cumsum(-1) <= (1 - top_p)
        remove[..., -1:] = False
        rows, m = torch.arange(len(values)), remove.sum(-1)
        cut = values[rows, m]  # the smallest kept value (the largest is always kept: m < V)
        below = values[rows, (m - 1).clamp(min=0)]
        if bool(((m == 0) | (below < cut)).all()) and not bool(logits.isnan().any()):
            return logits.masked_fill(logits < cut[:, None], -float("inf"))
    return _top_p_sorted(logits, top_p)


def _top_p_sorted(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The warper's own way: a sort and a scatter of the removed positions back to the tokens."""
    sorted_logits, order = torch.sort(logits, descending=False)
    remove = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
    remove[..., -1:] = False
    return logits.masked_fill(remove.scatter(1, order, remove), -float("inf"))


@functools.cache
def _growing_layers() -> bool:
    """Whether this transformers' caches have layers that `_growing_cache` can grow in place."""
    try:
        from transformers.cache_utils import DynamicLayer  # noqa: F401
    except ImportError:
        return False
    return True


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
            if not self.is_initialized:
                return
            order, m = indices.tolist(), len(indices)
            moves = [(j, i) for j, i in enumerate(order) if i != j]
            if m <= self._k.shape[0] and all(i >= m for _, i in moves) and len(set(order)) == m:
                # rows leaving (`_Pool.step`): the rows past the kept count move into the holes, in
                # place and over the used columns only, instead of a copy of the whole buffer
                n = self._n
                for j, i in moves:
                    self._k[j, :, :n] = self._k[i, :, :n]
                    self._v[j, :, :n] = self._v[i, :, :n]
                self._k, self._v = self._k[:m], self._v[:m]
            else:  # any other selection (a prompt's row copied for its n samples)
                self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]

    cache = DynamicCache()
    Cache.__init__(cache, layer_class_to_replicate=Layer)
    return cache


def decode(model, requests: list[Request], *, pad_id: int, end_ids: set[int],
           detokenize: Callable[[list[int]], str], temperature: float = 1.0, top_p: float = 1.0,
           max_sequences: int = 96) -> list[list[list[Generated]]]:
    """For each request, for each prompt, its n `Generated` sequences. At most ``max_sequences``
    sequences are live at once; requests (never split) enter in chunks of similar prompt length,
    the next chunk as soon as finished sequences have left room for it (`_Pool`)."""
    out: list[list[list[Generated]]] = [[[] for _ in r.prompts] for r in requests]
    pool = _Pool(model, requests, pad_id, max_sequences)
    queue = _chunks(requests, max(1, max_sequences // REFILL_PARTS))
    with torch.inference_mode():
        while queue or pool.alive:
            while queue and pool.fits(queue[0]):
                pool.admit(queue.pop(0))
            pool.step(end_ids, detokenize, temperature, top_p)
    for seq in pool.seqs:
        out[seq.req][seq.prompt].append(Generated(seq.ids, seq.logprobs))
    return out


# Chunks are a fraction of the pool's capacity, so one enters as soon as that fraction of the
# live sequences has ended: a decode's steps then run near capacity instead of draining each
# chunk down to its one longest sequence. Measured on 8 of the demo's tasks (every kind of
# generation a collection makes): chunk by chunk, 1,998 of 2,498 decoding steps held fewer than
# 8 sequences; pooled, 730 steps in all for the same 13,130 tokens.
REFILL_PARTS = 2


def _chunks(requests: list[Request], max_sequences: int, slack: float = 1.25) -> list[list[int]]:
    """Requests grouped by prompt length: left padding to a chunk's longest prompt costs every
    other row of the chunk that many more cached positions on every step, so a chunk's
    longest prompt is at most ``slack`` times (+16 tokens) its shortest."""
    order = sorted(range(len(requests)), key=lambda i: max(map(len, requests[i].prompts)))
    chunks: list[list[int]] = []
    size, shortest = 0, 0
    for i in order:
        req = requests[i]
        need, lo, hi = req.sequences, min(map(len, req.prompts)), max(map(len, req.prompts))
        if chunks and size + need <= max_sequences and hi <= slack * shortest + 16:
            chunks[-1].append(i)
            size, shortest = size + need, min(shortest, lo)
        else:
            chunks.append([i])
            size, shortest = need, lo
    return chunks


class _Pool:
    """The live sequences of one decode: their KV cache rows (left padded to one width), the
    attention mask, each row's next position and the logits its next token is chosen from. A
    chunk is admitted by encoding its prompts on their own and joining that cache to the live
    one (`_join`); a finished sequence's row is dropped the step it ends."""

    def __init__(self, model, requests: list[Request], pad_id: int, max_sequences: int):
        self.model, self.requests, self.pad_id, self.max_sequences = model, requests, pad_id, max_sequences
        self.device = next(model.parameters()).device
        params = inspect.signature(type(model).forward).parameters  # the class's (an instance may wrap it)
        # only the last position's logits (a vocabulary row per prompt token would be wasted memory)
        self.keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.arg = "cache" if "cache" in params else "past_key_values"  # the argument's name before transformers 5
        self.seqs: list[_Seq] = []
        self.alive: list[int] = []  # batch rows -> seqs
        self.gens: dict[int, torch.Generator] = {}
        self.cache = self.mask = self.next_pos = self.logits = None
        self.joinable = False  # whether a chunk can join live sequences (the growing cache's layers)

    def fits(self, chunk: list[int]) -> bool:
        if not self.alive:
            return True
        need = sum(self.requests[i].sequences for i in chunk)
        return self.joinable and len(self.alive) + need <= self.max_sequences

    def admit(self, chunk: list[int]) -> None:
        requests, device = self.requests, self.device
        rows = [(i, j) for i in chunk for j in range(len(requests[i].prompts))]
        self.gens.update({i: torch.Generator(device=device).manual_seed(requests[i].seed) for i in chunk})
        heads = _shared_heads(requests, chunk) if _growing_layers() else {}
        shared = {(i, j): heads[i][1][j] for i, j in rows if i in heads and heads[i][1][j]}
        plain = [r for r in rows if r not in shared]
        encoded = ([(plain, *self._encode(plain))] if plain else []) + \
            (self._encode_shared([r for r in rows if r in shared], heads, shared) if shared else [])
        parts, next_pos, logits = [], [], []
        if self.cache is not None:
            parts, next_pos, logits = [(self.cache, self.mask)], [self.next_pos], [self.logits]
        for part, first, mask, pos in encoded:
            # each prompt's cache, copied for each of its n sequences
            expand = []
            for r, (i, j) in enumerate(part):
                for c in range(requests[i].n):
                    self.alive.append(len(self.seqs))
                    # its place in its request (prompt, copy), whatever order the parts were encoded in
                    self.seqs.append(_Seq(i, j, j * requests[i].n + c))
                    expand.append(r)
            index = torch.tensor(expand, device=device)
            cache = _cache_of(first)
            cache.batch_select_indices(index)
            parts.append((cache, mask[index]))
            next_pos.append(pos[index, -1] + 1)
            logits.append(first.logits[index, -1])
        self.cache, self.mask = _join(parts, self._room())
        self.next_pos, self.logits = torch.cat(next_pos), torch.cat(logits)
        self.joinable = hasattr((getattr(self.cache, "layers", None) or [None])[0], "_k")

    def _encode(self, rows: list[tuple[int, int]]) -> tuple:
        """The rows' prompts in one forward pass, left padded: (output, mask, positions)."""
        prompts = [self.requests[i].prompts[j] for i, j in rows]
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = _left_mask(list(map(len, prompts)), width, self.device)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        first = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                           **{self.arg: _growing_cache(0)}, **self.keep_last)
        return first, mask, pos

    def _encode_shared(self, rows: list[tuple[int, int]], heads: dict, shared: dict) -> list[tuple]:
        """As `_encode`, for rows whose first tokens are their base prompt's (``shared``: row ->
        how many, `_shared_heads`): the bases' heads are encoded once, in one pass; then rows
        with tails of similar length (padding a short tail to a long one would cost what sharing
        saves) take their heads' cache, the columns each shares, and encode their tails after
        them. The tails are left padded after the heads, so each row's head then moves right to
        meet its tail (a cached key or value depends on the token and its position id, not on
        the column it sits in): each row's tokens are contiguous and right-aligned, as `_encode`
        leaves them. One (rows, output, mask, positions) per group of tails."""
        requests, device = self.requests, self.device
        owners = list(dict.fromkeys(i for i, _ in rows))
        slot = {i: s for s, i in enumerate(owners)}
        head_ids = [requests[i].prompts[heads[i][0]][:max(heads[i][1])] for i in owners]
        wh = max(map(len, head_ids))
        hmask = _left_mask(list(map(len, head_ids)), wh, device)
        ids = torch.tensor([[self.pad_id] * (wh - len(h)) + h for h in head_ids], device=device)
        head_cache = _cache_of(self.model(input_ids=ids, attention_mask=hmask, use_cache=True,
                                          position_ids=(hmask.cumsum(-1) - 1).clamp_min(0),
                                          **{self.arg: _growing_cache(0)}, **self.keep_last))
        tails = {r: requests[r[0]].prompts[r[1]][shared[r]:] for r in rows}
        out = []
        for group in _similar_lengths(rows, [len(tails[r]) for r in rows]):
            starts = [wh - len(head_ids[slot[i]]) for i, _ in group]
            c0, wt = min(starts), max(len(tails[r]) for r in group)
            width = wh - c0  # the group's head columns: from the first any of its rows uses
            index = torch.tensor([slot[i] for i, _ in group], device=device)
            cache = _growing_cache(wt)
            for li, layer in enumerate(head_cache.layers):
                cache.update(layer.keys[index, :, c0:], layer.values[index, :, c0:], li)
            at = torch.tensor([s - c0 for s in starts], device=device)[:, None]
            n = torch.tensor([shared[r] for r in group], device=device)[:, None]
            cols = torch.arange(width, device=device)[None, :]
            tmask = _left_mask([len(tails[r]) for r in group], wt, device)
            mask = torch.cat([((cols >= at) & (cols < at + n)).long(), tmask], dim=1)
            tpos = ((tmask.cumsum(-1) - 1).clamp_min(0) + n) * tmask
            ids = torch.tensor([[self.pad_id] * (wt - len(tails[r])) + tails[r] for r in group], device=device)
            first = self.model(input_ids=ids, attention_mask=mask, position_ids=tpos, use_cache=True,
                               **{self.arg: cache}, **self.keep_last)
            for b, r in enumerate(group):
                start, k, end = int(at[b]), shared[r], width + wt - len(tails[r])  # the tail begins at end
                if start + k != end:
                    for layer in cache.layers:
                        for buf in (layer._k, layer._v):
                            buf[b, :, end - k: end] = buf[b, :, start: start + k].clone()
            mask = _left_mask([len(requests[i].prompts[j]) for i, j in group], width + wt, device)
            out.append((group, first, mask, (mask.cumsum(-1) - 1).clamp_min(0)))
        return out

    def _room(self) -> int:
        """Cache positions the live sequences may still add (each step adds one)."""
        return max(self.requests[s.req].max_new_tokens - len(s.ids) for s in (self.seqs[a] for a in self.alive)) + 1

    def step(self, end_ids: set[int], detokenize, temperature: float, top_p: float) -> None:
        """Choose each live sequence's next token; drop the ended; one forward pass for the rest."""
        alive, seqs, device = self.alive, self.seqs, self.device
        chosen, logp = _choose(self.logits, [seqs[s] for s in alive], self.requests, self.gens, temperature, top_p)
        keep = []
        for b, (s, tok, lp) in enumerate(zip(alive, chosen.tolist(), logp.tolist())):
            seq = seqs[s]
            seq.ids.append(tok)
            seq.logprobs.append(lp)
            if not _ended(seq, tok, self.requests[seq.req], end_ids, detokenize):
                keep.append(b)
        if len(keep) < len(alive):
            if not keep:
                self.alive, self.cache = [], None
                self.mask = self.next_pos = self.logits = None
                return
            keep = _fill_holes(keep, len(alive))
            self.alive = [alive[b] for b in keep]
            sel = torch.tensor(keep, device=device)
            self.cache.batch_select_indices(sel)
            chosen, self.mask, self.next_pos = chosen[sel], self.mask[sel], self.next_pos[sel]
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        nxt = self.model(input_ids=chosen[:, None], attention_mask=self.mask, position_ids=self.next_pos[:, None],
                         use_cache=True, **{self.arg: self.cache})
        self.cache, self.logits, self.next_pos = _cache_of(nxt), nxt.logits[:, -1], self.next_pos + 1


def _fill_holes(keep: list[int], n: int) -> list[int]:
    """The rows kept (ascending), as the new batch's order: a row that stays below the kept
    count stays where it is, and the rows past it fill the holes the ended rows left, so the
    cache moves only those rows (``batch_select_indices``)."""
    m = len(keep)
    movers = [b for b in keep if b >= m]
    kept = set(keep)
    order = list(range(m))
    for j, b in zip((j for j in range(m) if j not in kept), movers):
        order[j] = b
    return order


def _left_mask(lengths: list[int], width: int, device) -> torch.Tensor:
    """The attention mask of rows of these lengths, left padded to ``width``."""
    return (torch.arange(width, device=device)[None, :] >= width - torch.tensor(lengths, device=device)[:, None]).long()


# A request's prompts that begin with the same tokens (AdvPrompt's variants of one prompt share
# about half of theirs with it, a probe's cut points of one program all but their ends) encode
# those tokens once (`_Pool._encode_shared`); a prompt sharing fewer than this many encodes alone.
MIN_SHARED = 16


def _similar_lengths(items: list, lengths: list[int], slack: float = 1.25) -> list[list]:
    """``items`` in groups of similar length (the longest at most ``slack`` times the shortest,
    +16), shortest first: what `_chunks` does for prompts, for the tails of shared heads."""
    groups: list[list] = []
    shortest = 0
    for i in sorted(range(len(items)), key=lengths.__getitem__):
        if groups and lengths[i] <= slack * shortest + 16:
            groups[-1].append(items[i])
        else:
            groups.append([items[i]])
            shortest = lengths[i]
    return groups


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    m = 0
    while m < n and a[m] == b[m]:
        m += 1
    return m


def _shared_heads(requests: list[Request], chunk: list[int]) -> dict[int, tuple[int, list[int]]]:
    """Request -> (its base prompt, each prompt's head shared with the base), for requests of
    several prompts where some share at least MIN_SHARED tokens with the base (the longest
    prompt or the first, whichever shares more). A head leaves its prompt at least its last
    token (the one whose logits choose the first new token); the base's head is the longest of
    the others'."""
    out = {}
    for i in chunk:
        prompts = requests[i].prompts
        if len(prompts) < 2:
            continue
        best = None
        for base in dict.fromkeys((max(range(len(prompts)), key=lambda j: len(prompts[j])), 0)):
            heads = [0 if j == base else min(_lcp(p, prompts[base]), len(p) - 1, len(prompts[base]) - 1)
                     for j, p in enumerate(prompts)]
            heads = [h if h >= MIN_SHARED else 0 for h in heads]
            heads[base] = max(heads)
            if heads[base] and (best is None or sum(heads) > sum(best[1])):
                best = (base, heads)
        if best is not None:
            out[i] = best
    return out


def _join(parts: list[tuple], reserve: int) -> tuple:
    """One cache and mask from several (cache, mask) parts: each part's rows keep the columns
    from the first one any of its rows attends to, right-aligned to the widest part (left
    padding, zeros, masked), with room for ``reserve`` more positions. The first part's cache
    object is reused. A cache without the growing layers (an old transformers) cannot be
    joined: it is returned as is when alone."""
    cache = parts[0][0]
    layers = getattr(cache, "layers", None)
    if len(parts) == 1 and (not layers or not hasattr(layers[0], "_k")):
        return parts[0]
    first = [int(m.any(0).int().argmax()) for _, m in parts]  # leading columns no row attends to
    widths = [m.shape[1] - f for (_, m), f in zip(parts, first)]
    width = max(widths)
    mask = torch.cat([torch.nn.functional.pad(m[:, f:], (width - w, 0)) for (_, m), f, w in zip(parts, first, widths)])
    for li, layer in enumerate(layers):
        for name in ("_k", "_v"):
            bufs = [getattr(c.layers[li], name) for c, _ in parts]
            b0 = bufs[0]
            new = b0.new_empty((sum(b.shape[0] for b in bufs), b0.shape[1], width + reserve, b0.shape[3]))
            at = 0
            for buf, f, w, (c, _) in zip(bufs, first, widths, parts):
                n = c.layers[li]._n
                new[at: at + buf.shape[0], :, :width - w] = 0  # masked, but never NaN garbage under the mask
                new[at: at + buf.shape[0], :, width - w: width] = buf[:, :, f: n]
                at += buf.shape[0]
            setattr(layer, name, new)
        layer._n = width
        layer.keys, layer.values = layer._k[:, :, :width], layer._v[:, :, :width]
    return cache, mask


class _Seq:
    __slots__ = ("req", "prompt", "index", "ids", "logprobs")

    def __init__(self, req: int, prompt: int, index: int):
        self.req, self.prompt, self.index, self.ids, self.logprobs = req, prompt, index, [], []


def _cache_of(output):
    return output.cache if getattr(output, "cache", None) is not None else output.past_key_values


def _choose(logits: torch.Tensor, seqs: list[_Seq], requests: list[Request], gens: dict, temperature: float,
            top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each live sequence's next token (argmax, or drawn from its request's stream) and its raw log-prob."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logits.argmax(-1)
    by_req: dict[int, list[int]] = {}
    # a request's rows draw in the order of its sequences, wherever the batch holds them
    for b in sorted(range(len(seqs)), key=lambda b: seqs[b].index):
        if not requests[seqs[b].req].greedy:
            by_req.setdefault(seqs[b].req, []).append(b)
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
