"""The sampler interface: k completions per prompt with the perplexity of each under
the *unwarped* model distribution. Backends: `hf` (transformers, CPU/GPU), `vllm`
(GPU clusters, extra [vllm]); an OpenAI-compatible backend slots in the same way.

Both backends share what decides a result: the per-task seed (`task_seed`), where a
completion ends and which generated tokens it keeps (`keep`: stop strings and EOS excluded),
and which tokens of a reference are scored (`reference_tokens`). Each sampler counts what it
had to do to its inputs in `stats` (a Counter; see STATS)."""

from __future__ import annotations

import math
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

# `Sampler.stats` keys, so a run can report them
PROMPT_TRUNCATED_LEFT = "prompt_truncated_left"  # HF: prompt longer than the context, oldest tokens dropped
REF_LOSS_CONTEXT_TRUNCATED_LEFT = "ref_loss_context_truncated_left"  # same, for a reference's prompt
REF_LOSS_NO_CONTINUATION = "ref_loss_no_continuation"  # nothing of the reference follows the prompt: NaN
REF_LOSS_TOO_LONG = "ref_loss_too_long"  # no context token precedes the reference, and it fills the window: NaN
# the reference's own tokens exceed the context: its head is scored (the tokens the window holds
# after half a window of context), as the fine-tune that leaked it saw it cut too
REF_LOSS_TRUNCATED_RIGHT = "ref_loss_truncated_right"
STATS = (PROMPT_TRUNCATED_LEFT, REF_LOSS_CONTEXT_TRUNCATED_LEFT, REF_LOSS_NO_CONTINUATION, REF_LOSS_TOO_LONG,
         REF_LOSS_TRUNCATED_RIGHT)
# `RefScores.notes`: a per-token field the backend cannot fill (the row is fine otherwise)
REF_MU_SIGMA_UNAVAILABLE = "ref_mu_sigma_unavailable"  # needs the full distribution (vLLM, endpoints)
REF_RANK_UNAVAILABLE = "ref_rank_unavailable"
REF_LOGPROBS_UNAVAILABLE = "ref_logprobs_unavailable"


@dataclass
class SampleConfig:
    backend: str = "hf"  # "hf" | "vllm" | "openai"
    k: int = 5
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 160
    batch_size: int = 8  # tasks per collection batch: the sample stage hands a sampler one batch per call
    seed: int = 0
    threads: int = 1
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    dtype: str = "auto"  # HF: auto is the checkpoint's own, float32 on a CPU for a 16-bit one (host.load_dtype)
    max_model_len: int | None = None  # context length in tokens; None: the model's own
    gpu_memory_utilization: float = 0.9  # vLLM: share of each GPU for weights and KV cache
    tensor_parallel_size: int = 1  # vLLM: GPUs one model is split over
    lora_adapter: str | None = None  # vLLM: a peft LoRA dir served over the base engine (a LoRARequest per prompt)
    merge_adapters: bool = False  # vLLM: merge lora_adapter into a cached copy of the base instead (GPT-2 needs it)
    # backend "openai": a black-box target behind an OpenAI-compatible /v1/completions
    endpoint_url: str = ""  # base URL up to /v1, e.g. http://host:8000/v1
    endpoint_model: str = ""  # the served model name; empty: the model given to make_sampler
    api_key_env: str = "OPENAI_API_KEY"  # NAME of the env variable holding the key, never the key
    concurrency: int = 8  # requests in flight
    # choices per request: OpenAI's completions API caps `n` at 128, so the next-token probes' draws
    # (`columns.next_draws`) above this go out as several requests of at most max_n each
    max_n: int = 128
    timeout_s: float = 120.0  # per request (connect, and each read)
    max_retries: int = 5  # retries after the first try (429/408/409/5xx, timeouts, connection, malformed)
    backoff_s: float = 1.0  # first retry waits ~this, doubling, half jittered; Retry-After wins
    # "chat": a model served only as a chat (/v1/chat/completions), asked in words to continue each
    # text (leakray.models.chat); it scores no given text and draws no next token, so the likelihood
    # detectors and the sampled next-token probes do not run on it
    endpoint_api: str = "completions"
    chat_extra_tokens: int = 32  # chat: tokens added to each request's budget for a fence and a preamble
    # a collection's rows that failed for a reason another attempt can cure (`stages.rows.row_retryable`:
    # an endpoint's rate limit, 5xx, timeout or dropped connection outlasting max_retries) are sampled
    # again, this many more passes, each after the whole collection and a pause of row_retry_wait_s
    row_retries: int = 1
    row_retry_wait_s: float = 30.0


@dataclass
class Samples:
    """k completions of one prompt; `completions` are truncated at the unit's end."""

    completions: list[str]
    perplexity: list[float]
    n_tokens: list[int]
    token_ids: list[list[int]] | None = None  # the scored tokens (`Kept.scored_ids`), for audits and tests
    notes: list[str] = field(default_factory=list)  # why this row is degraded or failed (counted per stage)


@dataclass
class RefScores:
    """What the model says about one reference continuation, token by token, over the tokens
    `reference_tokens` scores. A field a backend cannot fill is None with a note saying why."""

    loss: float  # mean token NLL of the scored reference tokens; NaN when unscorable
    logprobs: list[float] | None  # per scored token: log p(token | prompt, ref_<t), raw (unwarped) model
    mu: list[float] | None  # per token: E_v[log p_v] = sum_v p_v log p_v (Min-K%++)
    sigma: list[float] | None  # per token: sqrt(E_v[(log p_v)^2] - mu^2) under p (Min-K%++)
    rank: list[int] | None  # per token: tokens with log-prob >= the reference token's, less itself (0 = argmax)
    notes: list[str] = field(default_factory=list)  # why something is missing ("ref_loss_too_long", ...)
    # sum of log p(token | earlier tokens) over the context (the prompt) tokens the same pass saw,
    # its first token aside (nothing predicts it); NaN when the backend gave none. A model that read
    # the whole sample in training knows its docstring too: the self-calibrated audit route reads
    # prompt and solution together (`evaluate.selfcal`).
    context_logprob: float = math.nan

    @classmethod
    def unscorable(cls, notes: list[str]) -> RefScores:
        return cls(math.nan, None, None, None, None, list(notes))


def scores_from_logprobs(logprobs: list[float], mu=None, sigma=None, rank=None, notes=(),
                         context: list[float] | None = None) -> RefScores:
    """A RefScores whose loss is exactly -mean(logprobs), and a note per missing field."""
    if not logprobs:
        return RefScores.unscorable([REF_LOSS_NO_CONTINUATION, *notes])
    notes = list(notes)
    if mu is None or sigma is None:
        mu = sigma = None
        notes.append(REF_MU_SIGMA_UNAVAILABLE)
    if rank is None:
        notes.append(REF_RANK_UNAVAILABLE)
    ctx = math.fsum(context) if context else math.nan
    return RefScores(-math.fsum(logprobs) / len(logprobs), list(logprobs), mu, sigma, rank, notes, ctx)


class Sampler(Protocol):
    stats: Counter

    def sample(self, prompts: list[str], languages: list[str], keys: list[str], *,
               k: int | None = None, greedy: bool = False) -> list[Samples]:
        """`keys` (task ids) seed each prompt's sampling, so a task's samples are the same
        whatever else shares its batch, and a retried batch gives the same output. Prompts
        that share a key (a task's perturbed variants) are one unit of work: a backend may
        batch them together. `k` overrides the config's k; `greedy` decodes greedily
        (temperature 0), one completion per prompt unless `k` says otherwise."""

    def greedy_probe(self, prompts: list[str], languages: list[str], keys: list[str],
                     max_new_tokens: int) -> list[str]:
        """One greedy continuation of each text (a prompt plus part of its reference: the
        memory probes of `leakray.features.probes`), at most `max_new_tokens` tokens, cut where
        the unit ends as `sample` cuts; texts sharing a key are one unit of work (a backend
        batches them, and reuses their common prefix where it can). Text only: no log-probs."""

    def next_token_draws(self, texts: list[str], keys: list[str], n: int) -> list[list[str]]:
        """``n`` one-token continuations of each text, exactly as given (no whitespace stripped,
        no stop strings), drawn at temperature 1 with top-p 1 (the model's own distribution),
        seeded by the key; an end of text draws "". Texts sharing a key are one unit of work
        (the next-token probe's cuts of one program). Text only: what an endpoint returns."""

    def reference_scores(self, prompts: list[str], references: list[str]) -> list[RefScores]:
        """Per-token log-probs (and, where the backend can, Min-K%++'s mu/sigma and the rank)
        of each reference's continuation of its prompt; unscorable rows (counted in `stats`)
        get NaN loss, None fields and the reason in `notes`."""

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        """Mean token NLL of each reference's continuation of its prompt; NaN (counted in
        `stats`) where there is no continuation or it does not fit the context."""


def n_completions(cfg, k: int | None, greedy: bool) -> int:
    """How many completions one prompt gets: `k` if given, else 1 greedy or the config's k."""
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return k if k is not None else (1 if greedy else cfg.k)


def scorable_reference(tok, prompt: str, reference: str, max_len: int,
                       stats: Counter) -> tuple[list[int], int] | str:
    """`reference_tokens`, or the reason (a `stats` key) it gave nothing to score."""
    local: Counter = Counter()
    got = reference_tokens(tok, prompt, reference, max_len, local)
    stats.update(local)
    if got is None:
        return next(iter(local))
    return got


def task_seed(seed: int, key: str) -> int:
    """The seed of one task's sampling: the run's seed and the task id, nothing else."""
    return (seed + zlib.crc32(key.encode())) % (2**31)


def tokens_covering(tok, ids: list[int], n_chars: int) -> int:
    """Fewest leading tokens whose decoded text covers the first `n_chars` characters
    (where a completion was cut, in tokens: perplexity is over the kept tokens only)."""
    for j in range(1, len(ids) + 1):
        if len(tok.decode(ids[:j], skip_special_tokens=True)) >= n_chars:
            return j
    return len(ids)


@dataclass
class Kept:
    text: str  # the completion, cut where its unit ends
    n_tokens: int  # generated tokens that make it (stop strings and EOS excluded)
    scored_ids: list[int]  # leading generated tokens whose log-probs make the perplexity


def keep(tok, ids: list[int], special: set[int], prompt: str, language: str) -> Kept:
    """What of one raw generation is the completion, in text and in tokens."""
    from leakray.models.stops import cut_point

    ids = list(ids)
    end = next((j for j, t in enumerate(ids) if t in special), len(ids))  # EOS / padding
    raw = tok.decode(ids[:end], skip_special_tokens=True)
    cut = cut_point(prompt, raw, language)
    n = tokens_covering(tok, ids[:end], cut) if end else 0
    # an immediate end of sequence has a probability too: then that one token is scored
    return Kept(raw[:cut].rstrip() + "\n", n, ids[:max(1, n)])


def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs)) if logprobs else math.nan


def reference_tokens(tok, prompt: str, reference: str, max_len: int, stats: Counter) -> tuple[list[int], int] | None:
    """(token ids, leading ones that are context) to score a reference's continuation, or
    None (counted in `stats`) when there is nothing to score. A continuation longer than
    `max_len` is scored on its head, after half a window of context.

    Context tokens are those the program shares with the generation prompt tokenised alone,
    so a token that straddles the boundary is scored, as it would be when sampled. Context
    beyond `max_len` is dropped from the left, as sampling drops it."""
    from leakray.data.tasks import continuation, generation_prompt, program_of

    cont = continuation(prompt, reference)
    if not cont.strip():
        stats[REF_LOSS_NO_CONTINUATION] += 1
        return None
    p_ids = tok(generation_prompt(prompt))["input_ids"]
    ids = tok(program_of(prompt, cont))["input_ids"]
    n_ctx = next((j for j, (a, b) in enumerate(zip(p_ids, ids)) if a != b), min(len(p_ids), len(ids)))
    if n_ctx >= len(ids):
        stats[REF_LOSS_NO_CONTINUATION] += 1
        return None
    if len(ids) - n_ctx >= max_len:  # at least one context token must precede the first scored one
        if n_ctx == 0:
            stats[REF_LOSS_TOO_LONG] += 1
            return None
        keep = min(n_ctx, max_len // 2)  # the context nearest the reference, then its head
        ids, n_ctx = ids[n_ctx - keep: n_ctx - keep + max_len], keep
        stats[REF_LOSS_TRUNCATED_RIGHT] += 1
        return ids, n_ctx
    if len(ids) > max_len:
        drop = len(ids) - max_len
        ids, n_ctx = ids[drop:], n_ctx - drop
        stats[REF_LOSS_CONTEXT_TRUNCATED_LEFT] += 1
    return ids, n_ctx
