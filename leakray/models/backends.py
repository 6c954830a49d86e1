"""The sampler for a backend name: HF transformers in-process, a vLLM engine, or an
OpenAI-compatible endpoint. Apart from `sampler.py` (the interface the backends implement)
so the interface does not import its implementations."""

from __future__ import annotations

from leakray.models.sampler import SampleConfig, Sampler


def make_sampler(model_path: str, cfg: SampleConfig) -> Sampler:
    if cfg.backend == "hf":
        from leakray.models.hf_sampler import HFSampler

        return HFSampler(model_path, cfg)
    if cfg.backend == "vllm":
        from leakray.models.vllm_sampler import VLLMSampler

        return VLLMSampler(model_path, cfg)
    if cfg.backend == "openai":
        from leakray.models.endpoint_sampler import EndpointSampler

        return EndpointSampler(model_path, cfg)
    raise ValueError(f"unknown sampler backend {cfg.backend!r} (expected 'hf', 'vllm' or 'openai')")
