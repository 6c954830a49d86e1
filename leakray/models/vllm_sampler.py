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

LoRA: shadow and target adapters share one base engine (`LLM(enable_lora=True)`), each
prompt carrying the `LoRARequest` of its adapter; nothing is merged or saved per adapter.
`VLLMSampler(base, cfg, adapters={"target": dir, "shadow": dir})` registers them (integer
ids 1, 2, ... in that order, fixed for the engine's life: vLLM caches an adapter's weights by
its id), and `sampler.using("shadow")` is a Sampler over the same engine with that adapter
(`using(None)`: the base). The config's `lora_adapter` (one adapter dir) does the same for
`make_sampler`; with `merge_adapters` it is merged into a cached copy of the base instead
(`merge_adapter`), for architectures vLLM serves without LoRA support (GPT-2, the demo's
base, is one).

Unverified on a GPU in this repository's CI (no GPU there); the request/response handling
is tested on CPU through a stand-in for `vllm`, and `scripts/gpu_check.py` is the end-to-end
check to run on a GPU machine.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from leakray.data.tasks import generation_prompt
from leakray.errors import BadInput, MissingExtra
from leakray.models.sampler import (PROMPT_TRUNCATED_LEFT, REF_LOGPROBS_UNAVAILABLE, RefScores, SampleConfig,
                                    Samples, keep, n_completions, perplexity, scorable_reference,
                                    scores_from_logprobs, task_seed)
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


# vLLM's accepted `max_lora_rank` values (LoRAConfig); the adapters' largest rank is rounded up
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
CONFIG_ADAPTER = "adapter"  # the name the config's `lora_adapter` is registered under


def adapter_rank(path: str | Path) -> int:
    """The LoRA rank `r` of a peft adapter directory (its adapter_config.json)."""
    cfg_file = Path(path) / "adapter_config.json"
    try:
        r = json.loads(cfg_file.read_text())["r"]
    except (OSError, ValueError, KeyError) as exc:
        raise BadInput(f"not a peft LoRA adapter directory (no readable 'r' in adapter_config.json): {exc}",
                       path=str(cfg_file), field="lora_adapter") from exc
    if not isinstance(r, int) or r < 1:
        raise BadInput(f"LoRA rank must be a positive integer, got {r!r}", path=str(cfg_file), field="r")
    return r


def engine_lora_rank(ranks) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds every adapter's rank."""
    top = max(ranks)
    for r in LORA_RANKS:
        if r >= top:
            return r
    raise BadInput(f"LoRA rank {top} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}", field="r")


def merge_adapter(base: str | Path, adapter: str | Path, out_dir: str | Path) -> Path:
    """Base + adapter merged by peft into a plain HF checkpoint at `out_dir` (tokenizer included);
    the `merge_adapters` option, and the HF side of scripts/gpu_check.py."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter))
    model.merge_and_unload().save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def _merged_path(base: str, adapter: str) -> str:
    """A merged copy of base + adapter, cached by the adapter's weights (a retrained adapter
    at the same path gets a new copy)."""
    from leakray.runs import cache_root, content_hash, file_digest

    weights = sorted(Path(adapter).glob("adapter_model.*"))
    key = content_hash(str(Path(base).resolve()), [file_digest(w) for w in weights],
                       (Path(adapter) / "adapter_config.json").read_text())
    out = cache_root() / f"merged-{key}"
    if not (out / "config.json").exists():
        tmp = out.with_name(out.name + ".partial")  # renamed only when complete
        merge_adapter(base, adapter, tmp)
        if not out.exists():  # another process may have finished first
            tmp.rename(out)
    return str(out)


# model_type (config.json) of architectures vLLM serves without LoRA support: adapters must be merged
NO_VLLM_LORA = frozenset({"gpt2"})


def check_lora_support(model_path: str | Path) -> None:
    """Refuse, before vLLM starts, LoRA over a base whose architecture vLLM has no LoRA for."""
    cfg_file = Path(model_path) / "config.json"
    try:
        model_type = json.loads(cfg_file.read_text()).get("model_type")
    except (OSError, ValueError):
        return  # a hub id or no readable config: vLLM says what it supports
    if model_type in NO_VLLM_LORA:
        raise BadInput(f"vLLM has no LoRA support for {model_type!r} models: set sample.merge_adapters=true "
                       "(serves a merged copy) or use sample.backend=hf", path=str(cfg_file), field="model_type")


def sampling_source(model_path: str, stage_info: Mapping, base_path: str, sample) -> tuple[str, str | None]:
    """(model dir, LoRA adapter dir or None) a protocol's collection samples one fine-tuned role from.

    `model_path` is the role's merged model, `stage_info` what its fine-tune stage recorded
    (`finetune`'s stats: "config" and, for a LoRA fine-tune, "adapter"), `base_path` the model
    that fine-tune started from, `sample` the SampleConfig. vLLM without `merge_adapters` serves
    a LoRA fine-tune as the base engine plus the role's adapter; every other case (HF backend,
    full fine-tune, no adapter saved, merging asked for) samples the merged model, with the
    config's own `lora_adapter`, if any, as before."""
    method = (stage_info.get("config") or {}).get("method")
    adapter = stage_info.get("adapter")
    if sample.backend == "vllm" and not sample.merge_adapters and method == "lora" and adapter:
        return base_path, adapter
    return model_path, sample.lora_adapter


class VLLMSampler:
    def __init__(self, model_path: str, cfg: SampleConfig, llm=None, *,
                 adapters: Mapping[str, str] | None = None, adapter: str | None = None,
                 engine_args: dict | None = None):
        """`adapters`: name -> peft LoRA dir, served over the one base engine; `adapter`: which
        one this sampler uses (None: the base; `using` gives the others). `engine_args` go to
        `vllm.LLM` as they are (e.g. enforce_eager) and win over the config's."""
        self.cfg = cfg
        self.stats: Counter = Counter()
        adapters = dict(adapters or {})
        from_cfg = getattr(cfg, "lora_adapter", None)  # SampleConfig.lora_adapter, where the config has it
        if from_cfg:
            if getattr(cfg, "merge_adapters", False):
                model_path = _merged_path(model_path, from_cfg)
            else:
                adapters.setdefault(CONFIG_ADAPTER, from_cfg)
                adapter = adapter or CONFIG_ADAPTER
        # name -> (lora_int_id, absolute dir); shared by every `using` view of this engine
        self._adapters: dict[str, tuple[int, str]] = {}
        ranks = []
        for name, path in adapters.items():
            ranks.append(adapter_rank(path))
            self._adapters[name] = (len(self._adapters) + 1, str(Path(path).resolve()))  # vLLM ids start at 1
        if adapter is not None and adapter not in self._adapters:
            raise BadInput(f"adapter {adapter!r} is not among the registered {sorted(self._adapters)}",
                           field="lora_adapter")
        self.adapter = adapter
        if llm is None:
            try:
                from vllm import LLM
            except ImportError as exc:
                raise MissingExtra("vllm", "vllm") from exc
            kwargs = dict(model=model_path, seed=cfg.seed, dtype=cfg.dtype, logprobs_mode="raw_logprobs",
                          max_model_len=cfg.max_model_len, gpu_memory_utilization=cfg.gpu_memory_utilization,
                          tensor_parallel_size=cfg.tensor_parallel_size,
                          enable_prefix_caching=True)  # a task's perturbed variants share their prefix
            if ranks:
                check_lora_support(model_path)
                kwargs.update(enable_lora=True, max_lora_rank=engine_lora_rank(ranks), max_loras=len(ranks))
            llm = LLM(**{**kwargs, **(engine_args or {})})
        self.llm = llm
        self.tok = llm.get_tokenizer()
        self.special = set(self.tok.all_special_ids)
        self.max_len = cfg.max_model_len or _engine_max_len(llm)

    @property
    def adapters(self) -> dict[str, int]:
        """Registered adapter names and their vLLM integer ids."""
        return {name: i for name, (i, _) in self._adapters.items()}

    def using(self, adapter: str | None) -> VLLMSampler:
        """This engine with another adapter (None: the base model); its own `stats`."""
        if adapter is not None and adapter not in self._adapters:
            raise BadInput(f"adapter {adapter!r} is not among the registered {sorted(self._adapters)}",
                           field="lora_adapter")
        view = copy.copy(self)
        view.adapter, view.stats = adapter, Counter()
        return view

    def _params(self, **kwargs):
        from vllm import SamplingParams

        return SamplingParams(**kwargs)

    def _lora_request(self, name: str, int_id: int, path: str):
        from vllm.lora.request import LoRARequest

        return LoRARequest(name, int_id, path)

    def _generate(self, prompt_ids: list[list[int]], params):
        """One `generate` call; every prompt carries this sampler's LoRARequest, if it has one."""
        extra = {}
        if self.adapter is not None:
            req = self._lora_request(self.adapter, *self._adapters[self.adapter])
            extra["lora_request"] = [req] * len(prompt_ids)
        return self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False,
                                 **extra)

    # the collection stage hands over a whole batch of tasks per call (each prompt seeded by its own
    # task, so the result does not depend on the batch); a prompt over the model's length fails the
    # call, and the stage then samples task by task so that it fails its row alone
    batches_tasks = True

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
        outputs = self._generate(prompt_ids, params)
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

    def greedy_probe(self, prompts: list[str], languages: list[str], keys: list[str],
                     max_new_tokens: int) -> list[str]:
        """All texts in one `generate` call, greedy, no log-probs; a task's probes share the prompt
        and the reference's head, which prefix caching computes once."""
        tokens = min(max_new_tokens, self.cfg.max_new_tokens)
        prompt_ids = [self.tok(generation_prompt(p))["input_ids"] for p in prompts]
        for key, ids in zip(keys, prompt_ids):
            if len(ids) + tokens > self.max_len:
                raise BadInput(f"task {key!r}: a probe has {len(ids)} tokens, which with {tokens} new tokens "
                               f"exceeds the model's length of {self.max_len}", field=T.PROMPT)
        params = [self._params(n=1, max_tokens=tokens, temperature=0.0, top_p=1.0, logprobs=None,
                               stop=stop_strings(prompt, lang), include_stop_str_in_output=True,
                               seed=task_seed(self.cfg.seed, key))
                  for prompt, lang, key in zip(prompts, languages, keys)]
        outputs = self._generate(prompt_ids, params)
        return [keep(self.tok, list(out.outputs[0].token_ids), self.special, prompt, lang).text
                for prompt, lang, out in zip(prompts, languages, outputs)]

    def next_token_draws(self, texts: list[str], keys: list[str], n: int) -> list[list[str]]:
        """All texts in one `generate` call: ``n`` one-token samples each at temperature 1, top-p
        1, no log-probs, the text's tokens as given; prefix caching computes a program's head once
        for all of its cuts. A text over the model's length leaves its oldest tokens out."""
        prompt_ids = []
        for text in texts:
            ids = self.tok(text)["input_ids"]
            if len(ids) + 1 > self.max_len:
                self.stats[PROMPT_TRUNCATED_LEFT] += 1
                ids = ids[len(ids) + 1 - self.max_len:]
            prompt_ids.append(ids)
        params = [self._params(n=n, max_tokens=1, temperature=1.0, top_p=1.0, logprobs=None,
                               seed=task_seed(self.cfg.seed, key)) for key in keys]
        outputs = self._generate(prompt_ids, params)
        return [["" if set(c.token_ids) & self.special else c.text for c in out.outputs] for out in outputs]

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
        outputs = self._generate([ids for _, ids, _ in todo],
                                 self._params(max_tokens=1, prompt_logprobs=0, temperature=0.0))
        for (i, ids, n_ctx), res in zip(todo, outputs):
            entries = res.prompt_logprobs
            if entries is None:
                out[i] = RefScores.unscorable([REF_LOGPROBS_UNAVAILABLE])
                continue
            span = range(max(1, n_ctx), len(ids))
            ranks = [_rank(entries[j], ids[j]) for j in span]
            context = [_logprob(entries[j], ids[j]) for j in range(1, n_ctx)]  # entries[0] is None
            out[i] = scores_from_logprobs([_logprob(entries[j], ids[j]) for j in span],
                                          rank=None if None in ranks else ranks, context=context)
        return out
