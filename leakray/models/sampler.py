"""The sampler interface: k completions per prompt with the perplexity of each under
the *unwarped* model distribution. Backends: `hf` (transformers, CPU/GPU), `vllm`
(GPU clusters, extra [vllm]); an OpenAI-compatible backend slots in the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass
class SampleConfig:
    backend: str = "hf"  # "hf" | "vllm"
    k: int = 5
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 160
    batch_size: int = 8  # prompts per generate call (x k sequences)
    seed: int = 0
    threads: int = 1
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    dtype: str = "auto"


@dataclass
class Samples:
    """k completions of one prompt; `completions` are truncated at the unit's end."""

    completions: list[str]
    perplexity: list[float]
    n_tokens: list[int]
    token_ids: list[list[int]] | None = None  # the kept tokens, for audits and tests


class Sampler(Protocol):
    def sample(self, prompts: list[str], languages: list[str], keys: list[str]) -> list[Samples]:
        """`keys` (task ids) seed each prompt's sampling, so a retried batch gives the same output."""

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        """Mean token NLL of each reference's continuation of its prompt."""


def tokens_covering(tok, ids: list[int], n_chars: int) -> int:
    """Fewest leading tokens whose decoded text covers the first `n_chars` characters
    (where a completion was cut, in tokens: perplexity is over the kept tokens only)."""
    for j in range(1, len(ids) + 1):
        if len(tok.decode(ids[:j], skip_special_tokens=True)) >= n_chars:
            return j
    return len(ids)


def make_sampler(model_path: str, cfg: SampleConfig) -> Sampler:
    if cfg.backend == "hf":
        from leakray.models.hf_sampler import HFSampler

        return HFSampler(model_path, cfg)
    if cfg.backend == "vllm":
        from leakray.models.vllm_sampler import VLLMSampler

        return VLLMSampler(model_path, cfg)
    raise ValueError(f"unknown sampler backend {cfg.backend!r} (expected 'hf' or 'vllm')")
