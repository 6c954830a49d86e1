"""Attention for a decoding step whose rows hold sequences of different lengths, left padded
to one width: each run of rows attends to the columns its own rows use, not the batch's width.

`leakray.models.decode` keeps many tasks' sequences in one batch, and a step's attention reads
every row's keys and values over the batch's width: a row padded from 150 to 450 positions
costs three times its own reads, and at the demo's batch sizes those reads are most of a step.
Here a one-token query's batch is split into runs of consecutive rows whose first attended
column is close, and each run calls transformers' own SDPA on its slice of the cache (views,
no copies). Masked columns add exact zeros to the softmax, so each row's attention is the same
function of its own columns; only the floating point's summation order may differ.

Registered with transformers' AttentionInterface as ``leakray_sdpa`` (its masks are SDPA's);
prompts (queries longer than one token) and unmasked batches go to SDPA unchanged.

On the CPU only. A GPU reads the padded columns in parallel for about the price of its own, and
each run is its own kernel launches: on an H200 the sample stage's work took 1.8-2.0x as long
with it as with plain SDPA (demo-size GPT-2: 5.53 s against 3.08 s; GPT-2 small: 8.65 against
4.39; float32, `benchmarks/bench_decode_device.py`), while on 2 CPU cores it is 1.2-1.4x faster."""

from __future__ import annotations

import torch

NAME = "leakray_sdpa"
# a new run starts where a row's first column is more than this many columns from its run's:
# 0 (a run per distinct first column) measured best on the demo's tasks against 16, the
# calls' overhead being smaller than the padded reads it saves
RUN_GAP = 0
_memo: list = [None, None]  # (mask, runs): the runs of the last mask seen (the same for every layer of a step)


def runs_of(starts: list[int], gap: int = RUN_GAP) -> list[tuple[int, int, int]]:
    """(first row, end row, first column) of each run of consecutive rows whose first attended
    column is within ``gap`` of the run's smallest."""
    runs: list[tuple[int, int, int]] = []
    a, lo, hi = 0, starts[0], starts[0]
    for b, s in enumerate(starts[1:], 1):
        if max(hi, s) - min(lo, s) > gap:
            runs.append((a, b, lo))
            a, lo, hi = b, s, s
        else:
            lo, hi = min(lo, s), max(hi, s)
    runs.append((a, len(starts), lo))
    return runs


def ragged_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or attention_mask is None or attention_mask.dtype != torch.bool or query.shape[0] < 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if _memo[0] is not attention_mask:
        starts = attention_mask[:, 0, -1, :].int().argmax(-1).tolist()
        _memo[:] = [attention_mask, runs_of(starts)]
    runs = _memo[1]
    if len(runs) == 1 and runs[0][2] == 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = [sdpa_attention_forward(module, query[a:b], key[a:b, :, s:], value[a:b, :, s:],
                                   attention_mask[a:b, :, :, s:], **kwargs)[0] for a, b, s in runs]
    return torch.cat(outs), None


def use_ragged_attention(model, any_device: bool = False) -> bool:
    """Switch ``model`` to ``leakray_sdpa`` where it runs SDPA on the CPU (anywhere with
    ``any_device``: checks and benchmarks) and this transformers can register an attention
    function and its mask; returns whether it did."""
    if not any_device and next(model.parameters()).device.type != "cpu":
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, ragged_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, TypeError):
        return False
    return model.config._attn_implementation == NAME
