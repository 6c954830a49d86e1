import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A seconds-sized GPT-2 + BPE tokenizer built by the same code as the demo's base model."""
    from leakray.models.offline import TinyLMConfig, pretrain

    out = tmp_path_factory.mktemp("tiny_lm")
    cfg = TinyLMConfig(vocab_size=400, n_layer=1, n_embd=32, n_head=2, n_positions=512, block_size=64,
                       batch_size=4, pretrain_seconds=3, corpus_mb=0.3, threads=1, warmup_steps=5)
    stats = pretrain(cfg, out, progress=False)
    return out, stats
