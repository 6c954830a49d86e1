"""Sampling with vLLM on GPU clusters (extra [vllm]).

`logprobs_mode="raw_logprobs"` makes vLLM report log-probabilities of the model's own
distribution, before temperature and top-p, which is what perplexity must measure.
Each request carries its own seed (`task_seed`, from the task id), so a task's samples do
not depend on what else shares the batch. Stops, kept tokens, perplexity and the scored
reference tokens are the HF sampler's (`leakray.models.sampler`, `leakray.models.stops`);
vLLM only generates. Prompts go in as token ids, tokenised as the HF sampler does, and one
longer than the model's length (less the generation budget) is refused with its task id.

Unverified on a GPU in this repository's CI (no GPU there); the request/response handling
is tested on CPU through a stand-in for `vllm.LLM`.
"""

from __future__ import annotations

from collections import Counter

from leakray.data.tasks import generation_prompt
from leakray.errors import BadInput, MissingExtra
from leakray.models.sampler import SampleConfig, Samples, keep, perplexity, reference_tokens, task_seed
from leakray.models.stops import stop_strings
from leakray.schema import T


def _logprob(entry, token_id: int) -> float:
    value = entry[token_id]
    return float(getattr(value, "logprob", value))


def _engine_max_len(llm) -> int:
    """The context length vLLM settled on (the model's, or `max_model_len` if given)."""
    try:
        return int(llm.llm_engine.model_config.max_model_len)
    except AttributeError as exc:
        raise RuntimeError("cannot read max_model_len from this vLLM version's engine; "
                           "set sample.max_model_len") from exc


class VLLMSampler:
    def __init__(self, model_path: str, cfg: SampleConfig, llm=None):
        self.cfg = cfg
        self.stats: Counter = Counter()
        if llm is None:
            try:
                from vllm import LLM
            except ImportError as exc:
                raise MissingExtra("vllm", "vllm") from exc
            llm = LLM(model=model_path, seed=cfg.seed, dtype=cfg.dtype, logprobs_mode="raw_logprobs",
                      max_model_len=cfg.max_model_len, gpu_memory_utilization=cfg.gpu_memory_utilization,
                      tensor_parallel_size=cfg.tensor_parallel_size)
        self.llm = llm
        self.tok = llm.get_tokenizer()
        self.special = set(self.tok.all_special_ids)
        self.max_len = cfg.max_model_len or _engine_max_len(llm)

    def _params(self, **kwargs):
        from vllm import SamplingParams

        return SamplingParams(**kwargs)

    def sample(self, prompts: list[str], languages: list[str], keys: list[str]) -> list[Samples]:
        cfg = self.cfg
        prompt_ids = [self.tok(generation_prompt(p))["input_ids"] for p in prompts]
        for key, ids in zip(keys, prompt_ids):
            if len(ids) + cfg.max_new_tokens > self.max_len:
                raise BadInput(f"task {key!r}: the prompt has {len(ids)} tokens, which with max_new_tokens="
                               f"{cfg.max_new_tokens} exceeds the model's length of {self.max_len}", field=T.PROMPT)
        params = [self._params(
            n=cfg.k, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens,
            logprobs=0,  # 0: only the sampled token's log-prob
            stop=stop_strings(prompt, lang),
            include_stop_str_in_output=True,  # the exact cut is `keep`'s, as in the HF sampler
            seed=task_seed(cfg.seed, key),
        ) for prompt, lang, key in zip(prompts, languages, keys)]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        results = []
        for prompt, lang, out in zip(prompts, languages, outputs):
            res = Samples([], [], [], [])
            for comp in out.outputs:
                ids = list(comp.token_ids)
                kept = keep(self.tok, ids, self.special, prompt, lang)
                lps = [_logprob(entry, t) for entry, t in zip(comp.logprobs, kept.scored_ids)]
                res.completions.append(kept.text)
                res.perplexity.append(perplexity(lps))
                res.n_tokens.append(kept.n_tokens)
                res.token_ids.append(kept.scored_ids)
            results.append(res)
        return results

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        """Mean NLL of the continuation tokens from vLLM's prompt log-probs (one pass, no sampling)."""
        losses = [float("nan")] * len(prompts)
        todo = []
        for i, (prompt, ref) in enumerate(zip(prompts, references)):
            # one position stays free: vLLM generates at least one token per request
            got = reference_tokens(self.tok, prompt, ref, self.max_len - 1, self.stats)
            if got is not None:
                todo.append((i, *got))
        if not todo:
            return losses
        outputs = self.llm.generate([{"prompt_token_ids": ids} for _, ids, _ in todo],
                                    self._params(max_tokens=1, prompt_logprobs=0, temperature=0.0), use_tqdm=False)
        for (i, ids, n_ctx), out in zip(todo, outputs):
            lps = [_logprob(out.prompt_logprobs[j], ids[j]) for j in range(max(1, n_ctx), len(ids))]
            losses[i] = -sum(lps) / len(lps) if lps else float("nan")
        return losses
