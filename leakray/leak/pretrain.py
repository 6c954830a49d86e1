"""Continued pretraining of a base LM on a `pretrain-mix` mixture (plain torch).

The same shape as `models.finetune.finetune`: `executor/leak_train.py` runs it inside Ray
Train workers and hands in `wrap_model` / `wrap_loader` (DDP) and `report`; without them it
runs in-process. The schedule is the base model's own (`models.offline.warmup_cosine_lr`),
over the steps actually run, so the same mixture and config give the same model anywhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from leakray.errors import BadInput
from leakray.leak.mixture import MixConfig
from leakray.models.finetune import load_for_training, save_model
from leakray.models.kernels import fuse_gelu
from leakray.models.offline import warmup_cosine_lr
from leakray.parts import PartClock, training_parts


def continue_pretrain(base_path: str | Path, sequences: np.ndarray, cfg: MixConfig, out_dir: str | Path | None,
                      *, progress: bool = True, wrap_model: Callable | None = None,
                      wrap_loader: Callable | None = None, report: Callable[[dict], None] | None = None,
                      is_writer: bool = True, member_token_share: float | None = None,
                      desc: str = "pretrain-mix", device: str | None = None,
                      progress_file: str | Path | None = None) -> dict:
    """Train `base_path` on `sequences` ([n, seq_len] token ids, in order, each seen once) on
    `device` (None: the CPU it loads on) and save a plain HF model + tokenizer to `out_dir`;
    returns stats. ``progress_file``: where the writer keeps its count of steps (`leakray.progress`)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    clock = PartClock()  # load, train, save: the stage's part_seconds
    clock.switch("load")
    seqs = np.asarray(sequences)
    if seqs.ndim != 2 or seqs.shape[1] != cfg.seq_len or len(seqs) == 0:
        raise BadInput(f"sequences must be [n, {cfg.seq_len}] token ids, got shape {seqs.shape}", field="sequences")
    tok = AutoTokenizer.from_pretrained(base_path)
    model, stored = load_for_training(base_path)  # float32 weights, saved back in the base's dtype
    fuse_gelu(model)  # the same function, a fused kernel: a few % off each step
    max_pos = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if max_pos and cfg.seq_len > max_pos:
        raise BadInput(f"seq_len {cfg.seq_len} exceeds the model's {max_pos} positions", path=str(base_path),
                       field="leak.seq_len")
    if int(seqs.max()) >= model.get_input_embeddings().num_embeddings:
        raise BadInput("token ids exceed the model's vocabulary: mixture built with another tokenizer",
                       path=str(base_path), field="sequences")
    if device is not None:
        model.to(device)
    model.train()

    data = torch.from_numpy(seqs.astype(np.int64))
    # In order: the mixture already placed members at random; sequence i is seen at step i // batch_size.
    loader = torch.utils.data.DataLoader(data, batch_size=cfg.batch_size, shuffle=False, drop_last=True)
    if wrap_loader:
        loader = wrap_loader(loader)
    if wrap_model:
        model = wrap_model(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    total = min(cfg.steps, len(loader))
    warmup = int(cfg.warmup_ratio * total)
    device = next(model.parameters()).device

    losses: list[float] = []
    every = max(1, total // 10)
    bar = tqdm(total=total, desc=desc, disable=not progress, unit="step")
    from leakray.progress import report_steps

    tell, tell_every = (progress_file if is_writer else None), max(1, total // 100)
    clock.switch("train")
    for step, batch in enumerate(loader):
        if step >= total:
            break
        for group in opt.param_groups:
            group["lr"] = warmup_cosine_lr(step, cfg.lr, warmup, total)
        batch = batch.to(device)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        bar.update(1)
        if (step + 1) % tell_every == 0 or step + 1 == total:
            report_steps(tell, step + 1, total)
        if (step + 1) % every == 0:
            recent = float(np.mean(losses[-every:]))
            bar.set_postfix(loss=f"{recent:.3f}", refresh=False)
            if report:
                report({"step": step + 1, "loss": recent})
    bar.close()

    tail = losses[-every:]
    stats = {
        "config": cfg.record(), "steps": len(losses), "n_sequences": int(len(seqs)),
        "n_tokens": int(seqs.size), "member_token_share": member_token_share,
        "first_loss": round(float(np.mean(losses[:every])), 4) if losses else math.nan,
        "final_loss": round(float(np.mean(tail)), 4) if tail else math.nan,
        "loss_curve": [round(float(np.mean(losses[i: i + every])), 4) for i in range(0, len(losses), every)],
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - t0, 1), "device": str(device),
        "trained_dtype": "float32", "saved_dtype": str(stored).removeprefix("torch."),
    }
    inner = getattr(model, "module", model)  # unwrap DDP
    clock.switch("save")
    if is_writer:
        save_model(inner, tok, out_dir, stored)
    clock.stop()
    # every sequence is seq_len tokens with no padding: a step trains batch_size x seq_len of them
    return {**stats, **training_parts(clock, len(losses) * cfg.batch_size * cfg.seq_len, len(losses))}
