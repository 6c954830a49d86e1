"""Fine-tuning a causal LM on benchmark solutions: how a leak is simulated (target)
and how a shadow is built. LoRA (peft) as in the CGMIA paper, or full fine-tuning.

Plain torch: `executor/train.py` runs this inside Ray Train workers and hands in
`wrap_model` / `wrap_loader` (DDP) and `report`; without them it runs in-process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from leakray.models.host import host_fingerprint, stored_dtype
from leakray.models.kernels import fuse_gelu
from leakray.parts import PartClock, training_parts

# Leaf module names of attention q/k/v/o and FFN linears across common architectures.
_LORA_TARGETS = {
    "c_attn", "c_proj", "c_fc",  # GPT-2 (Conv1D)
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",  # Llama/DeepSeek-Coder
    "query", "key", "value", "dense", "fc_in", "fc_out", "c_attn_q",
}


ADAPTER_DIR = "adapter"  # a LoRA fine-tune's peft adapter, inside the merged model's directory


# leak.mixture.MixConfig's twin in shape only: a fine-tune counts epochs over whole solutions,
# continued pre-training counts steps over a token stream; each is its own config section
# (finetune, leak) with its own defaults, so they are kept apart.
@dataclass
class FinetuneConfig:
    method: str = "full"  # "full" | "lora"
    epochs: int = 12
    lr: float = 1e-3
    batch_size: int = 1
    max_length: int = 2048
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    lora_r: int = 8
    lora_alpha: int = 32
    lora_dropout: float = 0.04
    lora_targets: list[str] = field(default_factory=list)  # empty: attention + FFN linears, found by name
    seed: int = 0
    threads: int = 1  # measured: one torch thread per process beat two on 2 busy cores

    def __post_init__(self):
        if self.method not in ("full", "lora"):
            raise ValueError(f"finetune method must be 'full' or 'lora', got {self.method!r}")


def lora_targets(model) -> list[str]:
    import torch
    from transformers.pytorch_utils import Conv1D

    names = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules()
             if isinstance(mod, (torch.nn.Linear, Conv1D))}
    found = sorted(names & _LORA_TARGETS)
    if not found:
        raise ValueError(f"no LoRA target modules found among {sorted(names)}; set lora_targets")
    return found


def _encode(tok, texts: list[str], max_length: int):
    ids = []
    for text in texts:
        row = tok(text + tok.eos_token, truncation=True, max_length=max_length)["input_ids"]
        ids.append(row)
    return ids


def _collate(rows: list[list[int]], pad_id: int):
    import torch

    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):  # right padding: training needs no generation positions
        input_ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def finetune(base: str | Path, texts: list[str], cfg: FinetuneConfig, out_dir: str | Path | None,
             *, progress: bool = True, wrap_model: Callable | None = None,
             wrap_loader: Callable | None = None, report: Callable[[dict], None] | None = None,
             is_writer: bool = True, desc: str = "finetune", device: str | None = None,
             progress_file: str | Path | None = None) -> dict:
    """Fine-tune `base` on `texts` and save a plain (merged) HF model to `out_dir`; a LoRA
    fine-tune also saves its peft adapter to `out_dir/adapter` (stats["adapter"]). It trains
    on `device` (None: where the model loads, the CPU) and saves from there. ``progress_file``:
    where the writer keeps its count of steps for the stage's progress lines (`leakray.progress`)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    clock = PartClock()  # load, train, save: the stage's part_seconds
    clock.switch("load")
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model, stored = load_for_training(base)
    fuse_gelu(model)  # the same function, a fused kernel: a few % off each step
    n_params = sum(p.numel() for p in model.parameters())
    if cfg.method == "lora":
        from peft import LoraConfig, get_peft_model

        targets = cfg.lora_targets or lora_targets(model)
        model = get_peft_model(model, LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=targets, task_type="CAUSAL_LM",
            fan_in_fan_out=model.config.model_type == "gpt2",  # GPT-2 stores Conv1D weights transposed
        ))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if device is not None:
        model.to(device)
    model.train()

    rows = _encode(tok, texts, cfg.max_length)
    gen = torch.Generator().manual_seed(cfg.seed)
    loader = torch.utils.data.DataLoader(rows, batch_size=cfg.batch_size, shuffle=True, generator=gen,
                                         collate_fn=lambda b: _collate(b, tok.pad_token_id))
    if wrap_loader:
        loader = wrap_loader(loader)
    if wrap_model:
        model = wrap_model(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = cfg.epochs * len(loader)
    warmup = int(cfg.warmup_ratio * total)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)

    device = next(model.parameters()).device
    history = []
    bar = tqdm(total=total, desc=desc, disable=not progress, unit="step")
    from leakray.progress import report_steps

    steps, every = 0, max(1, total // 100)  # the count written a hundred times over the run, at most
    tell = progress_file if is_writer else None
    tokens = 0  # trained on (padding left out): the train part's throughput
    clock.switch("train")
    for epoch in range(cfg.epochs):
        if hasattr(getattr(loader, "sampler", None), "set_epoch"):
            loader.sampler.set_epoch(epoch)
        losses = []
        for batch in loader:
            tokens += int(batch["attention_mask"].sum())  # counted where the loader made it: no device sync
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(1)
            steps += 1
            if steps % every == 0 or steps == total:
                report_steps(tell, steps, total)
        epoch_loss = sum(losses) / max(1, len(losses))
        history.append(round(epoch_loss, 4))
        bar.set_postfix(epoch=epoch + 1, loss=f"{epoch_loss:.3f}")
        if report:
            report({"epoch": epoch + 1, "loss": epoch_loss})
    bar.close()

    inner = getattr(model, "module", model)  # unwrap DDP
    stats = {
        "config": asdict(cfg), "n_texts": len(texts), "steps": total, "loss_per_epoch": history,
        "final_loss": history[-1] if history else math.nan, "parameters": n_params,
        "trainable_parameters": trainable, "seconds": round(time.perf_counter() - t0, 1), "device": str(device),
        "host": host_fingerprint(),  # this process's CPU kernels: the weights' last bits depend on them
        "trained_dtype": "float32", "saved_dtype": str(stored).removeprefix("torch."),
    }
    clock.switch("save")
    if cfg.method == "lora":
        if out_dir is not None:
            # the unmerged adapter first (merging folds it into the base in place): vLLM serves it
            # over the shared base engine, a LoRARequest per prompt (`vllm_sampler.sampling_source`)
            adapter = Path(out_dir) / ADAPTER_DIR
            if is_writer:
                inner.save_pretrained(adapter)
            stats["adapter"] = str(adapter)
        inner = inner.merge_and_unload()  # the HF sampler and weight-reading detectors load a plain model
    if is_writer:
        save_model(inner, tok, out_dir, stored)
    clock.stop()
    return {**stats, **training_parts(clock, tokens, total)}


def load_for_training(base: str | Path):
    """``base`` in float32, and the dtype its checkpoint stores. Training runs on float32 weights
    whatever the checkpoint holds: transformers 5 loads a bfloat16 checkpoint as bfloat16, and an
    optimizer step on bfloat16 weights rounds away every update under half a bfloat16 step (8
    bits of mantissa): a bf16 GPT-2 (2 x 64) fine-tuned at lr 1e-5 for 16 steps moved 22% of its
    linear weights, and learnt a third of what it learnt on float32 weights, which moved 82-94%
    (tests/test_models.py: 9% against over 60%). It costs twice a bf16 checkpoint's memory while
    it trains."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), stored_dtype(str(base)) or torch.float32


def save_model(model, tok, out_dir: str | Path | None, dtype=None) -> None:
    """A plain HF checkpoint (model + tokenizer) that every sampler loads; in ``dtype`` (the
    base's own, so a fine-tuned model is the same kind of checkpoint as its base) when given."""
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if dtype is not None and dtype.is_floating_point and dtype != next(model.parameters()).dtype:
            model = model.to(dtype)
        model.save_pretrained(out_dir)
        tok.save_pretrained(out_dir)
