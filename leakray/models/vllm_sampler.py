"""Sampling with vLLM on GPU clusters (extra [vllm]).

`logprobs_mode="raw_logprobs"` makes vLLM report log-probabilities of the model's own
distribution, before temperature and top-p, which is what perplexity must measure.
Each request carries its own seed (derived from the task id), so a retried actor
task reproduces its samples whatever else shares the batch.

Unverified on a GPU in this repository's CI (no GPU there); the request/response
handling is tested on CPU through a stand-in for `vllm.LLM`.
"""

from __future__ import annotations

import math
import zlib

from leakray.errors import MissingExtra
from leakray.data.tasks import continuation, generation_prompt, program_of
from leakray.models.sampler import SampleConfig, Samples, tokens_covering
from leakray.models.stops import cut_point, stop_strings


def _logprob(entry, token_id: int) -> float:
    value = entry[token_id]
    return float(getattr(value, "logprob", value))


class VLLMSampler:
    def __init__(self, model_path: str, cfg: SampleConfig, llm=None):
        self.cfg = cfg
        if llm is None:
            try:
                from vllm import LLM
            except ImportError as exc:
                raise MissingExtra("vllm", "vllm") from exc
            llm = LLM(model=model_path, seed=cfg.seed, dtype=cfg.dtype, logprobs_mode="raw_logprobs")
        self.llm = llm
        self.tok = llm.get_tokenizer()

    def _params(self, **kwargs):
        from vllm import SamplingParams

        return SamplingParams(**kwargs)

    def sample(self, prompts: list[str], languages: list[str], keys: list[str]) -> list[Samples]:
        params = [self._params(
            n=self.cfg.k, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
            max_tokens=self.cfg.max_new_tokens, logprobs=0,  # 0: only the sampled token's log-prob
            stop=stop_strings(lang) if lang == "python" else None,
            seed=(self.cfg.seed + zlib.crc32(key.encode())) % (2**31),
        ) for lang, key in zip(languages, keys)]
        prompts = [generation_prompt(p) for p in prompts]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for prompt, lang, out in zip(prompts, languages, outputs):
            texts, ppls, counts = [], [], []
            for comp in out.outputs:
                ids = list(comp.token_ids)
                cut = cut_point(prompt, comp.text, lang)
                # vLLM already stopped at Python's stop strings; Java closes by brace count
                n = tokens_covering(self.tok, ids, cut) if cut < len(comp.text) else len(ids)
                lps = [_logprob(entry, t) for entry, t in zip(comp.logprobs[:max(1, n)], ids)]
                texts.append(comp.text[:cut].rstrip() + "\n")
                ppls.append(math.exp(-sum(lps) / len(lps)) if lps else math.nan)
                counts.append(n)
            results.append(Samples(texts, ppls, counts))
        return results

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        """Mean NLL of the solution tokens from vLLM's prompt log-probs (one pass, no sampling)."""
        texts = [program_of(p, continuation(p, r)) for p, r in zip(prompts, references)]
        outputs = self.llm.generate(texts, self._params(max_tokens=1, prompt_logprobs=0, temperature=0.0),
                                    use_tqdm=False)
        losses = []
        for prompt, out in zip(prompts, outputs):
            n_prompt = len(self.tok(generation_prompt(prompt))["input_ids"])
            ids = list(out.prompt_token_ids)
            lps = [_logprob(entry, t) for i, (entry, t) in enumerate(zip(out.prompt_logprobs, ids))
                   if entry is not None and i >= n_prompt]
            losses.append(-sum(lps) / len(lps) if lps else math.nan)
        return losses
