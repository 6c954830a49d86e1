"""Sampling with vLLM on GPU clusters (extra [vllm]).

`logprobs_mode="raw_logprobs"` makes vLLM report log-probabilities of the model's own
distribution, before temperature and top-p, which is what perplexity must measure.
Each request carries its own seed (`task_seed`, from the task id), so a task's samples do
not depend on what else shares the batch. Stops, kept tokens, perplexity and the scored
reference tokens are the HF sampler's (`leakray.models.sampler`, `leakray.models.stops`);
vLLM only generates. Prompts go in as token ids, tokenised as the HF sampler does, and one
longer than the model's length (less the generation budget) is refused with its task id.

Prompts that share a key (one task's perturbed variants) go out in the same `generate` call
as everything else, and prefix caching (`enable_prefix_caching=True`) lets them reuse the
KV cache of their common prefix. `reference_scores` reads the scored tokens' log-probs and
ranks from `prompt_logprobs` (vLLM's `Logprob.rank` is 1-based; leakray's is 0-based);
Min-K%++'s mean/std over the vocabulary need the full distribution, which vLLM does not
return: None with the note `ref_mu_sigma_unavailable`.

Unverified on a GPU in this repository's CI (no GPU there); the request/response handling
is tested on CPU through a stand-in for `vllm.LLM`.
"""

from __future__ import annotations

from collections import Counter

from leakray.data.tasks import generation_prompt
from leakray.errors import BadInput, MissingExtra
from leakray.models.sampler import (REF_LOGPROBS_UNAVAILABLE, RefScores, SampleConfig, Samples, keep,
                                    n_completions, perplexity, scorable_reference, scores_from_logprobs,
                                    task_seed)
from leakray.models.stops import stop_strings
from leakray.schema import T


def _logprob(entry, token_id: int) -> float:
    value = entry[token_id]
    return float(getattr(value, "logprob", value))


def _rank(entry, token_id: int) -> int | None:
    """0-based rank of the token (vLLM's `Logprob.rank` counts from 1), None where not reported."""
    rank = getattr(entry[token_id], "rank", None)
    return None if rank is None else int(rank) - 1


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
                      tensor_parallel_size=cfg.tensor_parallel_size,
                      enable_prefix_caching=True)  # a task's perturbed variants share their prefix
        self.llm = llm
        self.tok = llm.get_tokenizer()
        self.special = set(self.tok.all_special_ids)
        self.max_len = cfg.max_model_len or _engine_max_len(llm)

    def _params(self, **kwargs):
        from vllm import SamplingParams

        return SamplingParams(**kwargs)

    def sample(self, prompts: list[str], languages: list[str], keys: list[str], *,
               k: int | None = None, greedy: bool = False) -> list[Samples]:
        cfg = self.cfg
        n = n_completions(cfg, k, greedy)
        decode = dict(temperature=0.0, top_p=1.0) if greedy else dict(temperature=cfg.temperature, top_p=cfg.top_p)
        prompt_ids = [self.tok(generation_prompt(p))["input_ids"] for p in prompts]
        for key, ids in zip(keys, prompt_ids):
            if len(ids) + cfg.max_new_tokens > self.max_len:
                raise BadInput(f"task {key!r}: the prompt has {len(ids)} tokens, which with max_new_tokens="
                               f"{cfg.max_new_tokens} exceeds the model's length of {self.max_len}", field=T.PROMPT)
        params = [self._params(
            n=n, max_tokens=cfg.max_new_tokens, **decode,
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
        return [s.loss for s in self.reference_scores(prompts, references)]

    def reference_scores(self, prompts: list[str], references: list[str]) -> list[RefScores]:
        """The continuation tokens' log-probs and ranks from vLLM's prompt log-probs (one pass,
        no sampling); mu/sigma are not available from vLLM."""
        out: list[RefScores | None] = [None] * len(prompts)
        todo = []
        for i, (prompt, ref) in enumerate(zip(prompts, references)):
            # one position stays free: vLLM generates at least one token per request
            got = scorable_reference(self.tok, prompt, ref, self.max_len - 1, self.stats)
            if isinstance(got, str):
                out[i] = RefScores.unscorable([got])
            else:
                todo.append((i, *got))
        if not todo:
            return out
        outputs = self.llm.generate([{"prompt_token_ids": ids} for _, ids, _ in todo],
                                    self._params(max_tokens=1, prompt_logprobs=0, temperature=0.0), use_tqdm=False)
        for (i, ids, n_ctx), res in zip(todo, outputs):
            entries = res.prompt_logprobs
            if entries is None:
                out[i] = RefScores.unscorable([REF_LOGPROBS_UNAVAILABLE])
                continue
            span = range(max(1, n_ctx), len(ids))
            ranks = [_rank(entries[j], ids[j]) for j in span]
            out[i] = scores_from_logprobs([_logprob(entries[j], ids[j]) for j in span],
                                          rank=None if None in ranks else ranks)
        return out
