"""Models built here, with no hub: a byte-level BPE tokenizer and a small GPT-2-style
LM pretrained for a bounded time on the interpreter's own standard library.

Both are cached under ``cache_root()/base-<hash of config>``, so the second run of
the demo reuses them; the default tiny and tiny-alt ship prebuilt (`leakray.models.prebuilt`), so
the first run on any machine copies them instead of training them. The result is an ordinary Hugging Face model directory:
everything downstream loads it with ``from_pretrained`` exactly as it would load
``deepseek-ai/deepseek-coder-1.3b-base``.
"""

from __future__ import annotations

import logging
import math
import random
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from leakray.runs import cache_root, content_hash, write_json_atomic

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
PAD = "<|pad|>"
IDS_FILE = "ids.npy"
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__", "turtledemo", "ensurepip"}


@dataclass
class TinyLMConfig:
    vocab_size: int = 4096
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    n_positions: int = 1024
    block_size: int = 384  # pretraining sequence length (covers ~90% of HumanEval solutions)
    batch_size: int = 8
    lr: float = 2e-3
    warmup_steps: int = 30
    # A fixed step count keeps the base model the same on every machine; the time cap
    # only guards a slow one (the steps actually run are recorded either way).
    max_steps: int = 500
    pretrain_seconds: float = 900.0
    corpus_mb: float = 12.0  # stdlib source read, at most
    seed: int = 0
    threads: int = 2


def stdlib_sources(max_bytes: int) -> list[str]:
    """Python source of the standard library, tests and demos excluded, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(p in _SKIP_DIRS or p.startswith("test") for p in parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    """Byte-level BPE trained locally, saved as a fast HF tokenizer (eos = pad-distinct)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS, PAD])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS, bos_token=EOS,
                                  unk_token=EOS, pad_token=PAD)
    tok.padding_side = "left"  # generation pads on the left
    tok.save_pretrained(out_dir)
    return tok


def corpus_tokens(cfg: TinyLMConfig):
    """The pretraining corpus as (tokenizer, token ids with EOS between files), cached by what
    they depend on (corpus size, vocabulary, this Python's standard library): base models that
    differ only in their training settings share them, and a quick base (30 steps) spent most
    of its build training the tokenizer and tokenizing 12 MB."""
    import numpy as np
    import torch
    from transformers import PreTrainedTokenizerFast

    key = content_hash(cfg.corpus_mb, cfg.vocab_size, sys.version, sysconfig.get_paths()["stdlib"])
    out = cache_root() / f"corpus-tokens-{key}"
    if not (out / IDS_FILE).exists():
        tmp = out.with_name(out.name + f".partial{os.getpid()}")  # renamed when complete: a killed build is redone
        texts = stdlib_sources(int(cfg.corpus_mb * 1e6))
        tok = train_tokenizer(texts, cfg.vocab_size, tmp)
        ids: list[int] = []
        for text in texts:
            ids.extend(tok(text)["input_ids"])
            ids.append(tok.eos_token_id)
        np.save(tmp / IDS_FILE, np.asarray(ids, dtype=np.int32))
        try:
            tmp.rename(out)
        except OSError:  # another process finished the same corpus first: theirs is the same
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    tok.padding_side = "left"  # generation pads on the left
    return tok, torch.from_numpy(np.load(out / IDS_FILE).astype(np.int64))


def _lm_config(cfg: TinyLMConfig, tok):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tok), n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )


def warmup_cosine_lr(step: int, peak: float, warmup_steps: int, total_steps: int, floor: float = 0.1) -> float:
    """Linear warmup, then cosine decay to floor x peak at total_steps (shared with `leak.pretrain`)."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * max(floor, 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, total_steps)))))


def pretrain(cfg: TinyLMConfig, out_dir: Path, progress: bool = True,
             progress_file: str | Path | None = None) -> dict:
    """Tokenizer + LM from scratch on stdlib source, for cfg.pretrain_seconds; returns stats.
    ``progress_file``: where to keep the count of steps for a stage's progress lines
    (`leakray.progress`)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import GPT2LMHeadModel

    from leakray.parts import PartClock, training_parts
    from leakray.progress import report_steps

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    clock = PartClock()  # tokenize, train, evaluate, save: the base stage's parts when it trains
    clock.switch("tokenize")
    tok, data = corpus_tokens(cfg)
    tok.save_pretrained(out_dir)
    n_val = cfg.block_size * 64
    train, val = data[:-n_val], data[-n_val:]

    model = GPT2LMHeadModel(_lm_config(cfg, tok))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(cfg.seed)

    def lr_at(step: int) -> float:  # over max_steps, never over the clock: the same model on any machine
        return warmup_cosine_lr(step, cfg.lr, cfg.warmup_steps, cfg.max_steps)

    clock.switch("train")
    step, t_train = 0, time.perf_counter()
    bar = tqdm(total=cfg.max_steps, desc="pretrain base LM", disable=not progress, unit="step")
    tell_every = max(1, cfg.max_steps // 100)  # the count written a hundred times at most
    model.train()
    while step < cfg.max_steps:
        elapsed = time.perf_counter() - t_train
        if elapsed >= cfg.pretrain_seconds:
            break
        starts = torch.randint(0, len(train) - cfg.block_size - 1, (cfg.batch_size,), generator=gen)
        batch = torch.stack([train[s: s + cfg.block_size] for s in starts])
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.2f}", refresh=False)
        if step % tell_every == 0 or step == cfg.max_steps:
            report_steps(progress_file, step, cfg.max_steps)
    bar.close()

    clock.switch("evaluate")
    model.eval()
    with torch.inference_mode():
        blocks = val[: (len(val) // cfg.block_size) * cfg.block_size].view(-1, cfg.block_size)
        val_loss = float(sum(model(input_ids=b[None], labels=b[None]).loss for b in blocks) / len(blocks))
    clock.switch("save")
    model.save_pretrained(out_dir)
    clock.stop()
    stats = {
        **training_parts(clock, step * cfg.batch_size * cfg.block_size, step),
        "config": asdict(cfg), "steps": step, "stopped_by_time_cap": step < cfg.max_steps,
        "val_loss": round(val_loss, 4),
        "train_tokens": int(len(train)), "parameters": sum(p.numel() for p in model.parameters()),
        "seconds_tokenizer": round(clock.seconds["tokenize"], 1), "seconds_total": round(time.perf_counter() - t0, 1),
    }
    write_json_atomic(out_dir / "pretrain.json", stats)
    log.info("base LM: %d steps, val loss %.3f", step, val_loss)
    return stats


def ensure_base_model(cfg: TinyLMConfig | None = None, progress: bool = True,
                      progress_file: str | Path | None = None) -> tuple[Path, dict]:
    """Path of the cached locally pretrained base model (building it on first use) and its stats.
    ``progress_file``: where a build keeps its count of steps (`pretrain`)."""
    cfg = cfg or TinyLMConfig()
    out = cache_root() / f"base-{content_hash(asdict(cfg))}"
    stats_file = out / "pretrain.json"
    if stats_file.exists():
        import json

        return out, {**json.loads(stats_file.read_text()), "cached": True}
    # renamed only when complete: a killed build is redone; one per process, so two processes
    # building the same base at once (parallel test workers, two drivers) never share a directory
    tmp = out.with_name(out.name + f".partial{os.getpid()}")
    from leakray.models import prebuilt

    # the package ships the default tiny and tiny-alt (used for their own config on any machine, each
    # file checked against the manifest's digest); anything else is trained
    stats = None if os.environ.get("LEAKRAY_NO_PREBUILT") else prebuilt.install(cfg, tmp)
    if stats is None:
        stats = pretrain(cfg, tmp, progress=progress, progress_file=progress_file)
    else:
        log.info("base LM: the prebuilt copy (%s)", prebuilt.shipped_for(cfg))
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same base first: theirs is the same model
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out, {**stats, "cached": False}
