"""Sampling with Hugging Face transformers; perplexity from `output_logits` (raw, unwarped —
the `scores` output is already reshaped by temperature and top-p).

Each task is one `generate` call of its k sequences, seeded by the task alone (`task_seed`):
sharing a call with other tasks would both draw from one random stream and change the
numerics through left padding, so a task's samples would depend on its batch-mates. The
cost is fewer sequences per call (k).

Prompts that share a key (one task's perturbed variants, AdvPrompt-MIA) are one unit: they
go into ONE left-padded `generate` call (per set of stop strings), seeded by the key, so the
variants' work is batched and the result still depends on the task alone. Left padding can
move the logits in their last bits: on CPU in float32, greedy variants batched per task gave
the same tokens as each generated alone (96/96 HumanEval variants, ~10x faster; the test
asserts it on three), but in bf16 a near-tie argmax may flip. Sampled (non-greedy) variants
share the key's random stream, so they depend on which variants come together.

`reference_scores` is one forward pass per reference: log_softmax over the scored positions
gives each token's log-prob, Min-K%++'s mean/std of log p over the vocabulary, and the rank."""

from __future__ import annotations

import inspect
from collections import Counter

from leakray.data.tasks import generation_prompt
from leakray.errors import BadInput
from leakray.models.sampler import (PROMPT_TRUNCATED_LEFT, RefScores, SampleConfig, Samples, keep,
                                    n_completions, perplexity, scorable_reference, scores_from_logprobs,
                                    task_seed)
from leakray.models.stops import stop_strings


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class HFSampler:
    def __init__(self, model_path: str, cfg: SampleConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.stats: Counter = Counter()
        self.device = _device(cfg.device)
        self.tok = AutoTokenizer.from_pretrained(model_path)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        dtype = getattr(torch, cfg.dtype) if cfg.dtype != "auto" else "auto"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
        own = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", 4096)
        self.max_positions = min(own, cfg.max_model_len) if cfg.max_model_len else own
        if self.max_positions - cfg.max_new_tokens < 1:
            raise BadInput(f"max_new_tokens={cfg.max_new_tokens} leaves no room for a prompt in the "
                           f"model's {self.max_positions} positions", field="sample.max_new_tokens")
        self.special = set(self.tok.all_special_ids)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def sample(self, prompts: list[str], languages: list[str], keys: list[str], *,
               k: int | None = None, greedy: bool = False) -> list[Samples]:
        n = n_completions(self.cfg, k, greedy)
        groups: dict[tuple, list[int]] = {}  # (key, stop strings) -> prompt indices, in order
        for i, (p, lang, key) in enumerate(zip(prompts, languages, keys)):
            groups.setdefault((key, tuple(stop_strings(p, lang))), []).append(i)
        out: list[Samples | None] = [None] * len(prompts)
        for (key, stops), idx in groups.items():
            for i, s in zip(idx, self._generate([prompts[i] for i in idx], [languages[i] for i in idx],
                                                key, list(stops), n, greedy)):
                out[i] = s
        return out

    def greedy_probe(self, prompts: list[str], languages: list[str], keys: list[str],
                     max_new_tokens: int) -> list[str]:
        groups: dict[tuple, list[int]] = {}
        for i, (p, lang, key) in enumerate(zip(prompts, languages, keys)):
            groups.setdefault((key, tuple(stop_strings(p, lang))), []).append(i)
        out: list[str] = [""] * len(prompts)
        for (key, stops), idx in groups.items():
            got = self._generate([prompts[i] for i in idx], [languages[i] for i in idx], key, list(stops), 1, True,
                                 max_new_tokens=min(max_new_tokens, self.cfg.max_new_tokens))
            for i, s in zip(idx, got):
                out[i] = s.completions[0]
        return out

    def _prompt_ids(self, prompt: str) -> list[int]:
        """The prompt's tokens; a prompt too long for the context loses its *oldest* tokens
        (the signature the model must continue is at the end), and that is counted."""
        ids = self.tok(generation_prompt(prompt))["input_ids"]
        room = self.max_positions - self.cfg.max_new_tokens
        if len(ids) > room:
            bos = self.tok.bos_token_id
            head = [ids[0]] if bos is not None and ids[0] == bos else []
            ids = head + ids[len(ids) - (room - len(head)):]
            self.stats[PROMPT_TRUNCATED_LEFT] += 1
        return ids

    def _generate(self, prompts: list[str], languages: list[str], key: str, stops: list[str],
                  n: int, greedy: bool, max_new_tokens: int | None = None) -> list[Samples]:
        """n completions of each prompt (one task's), in one `generate` call seeded by the key."""
        import torch

        cfg = self.cfg
        rows = [self._prompt_ids(p) for p in prompts]
        width = max(map(len, rows))
        pad = self.tok.pad_token_id
        # left padding: every prompt ends where generation starts (one prompt: no padding)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        # greedy gives one sequence per prompt (transformers refuses num_return_sequences > 1 without
        # sampling); n greedy copies are the same sequence repeated
        decode = dict(do_sample=False, num_return_sequences=1, temperature=None, top_p=None, top_k=None) \
            if greedy else dict(do_sample=True, num_return_sequences=n, temperature=cfg.temperature,
                                top_p=cfg.top_p, top_k=0)
        torch.manual_seed(task_seed(cfg.seed, key))
        with torch.inference_mode():
            gen = self.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens or cfg.max_new_tokens,
                output_logits=True,
                return_dict_in_generate=True, stop_strings=stops or None, tokenizer=self.tok,
                pad_token_id=pad, **decode,
            )
        new_tokens = gen.sequences[:, width:]
        logits = torch.stack(gen.logits, dim=1).float()  # [rows * per_row, T, V], raw
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens[..., None]).squeeze(-1)
        per_row = 1 if greedy else n
        results = []
        for r, (prompt, language) in enumerate(zip(prompts, languages)):
            out = Samples([], [], [], [])
            for s in range(r * per_row, (r + 1) * per_row):
                kept = keep(self.tok, new_tokens[s].tolist(), self.special, prompt, language)
                ppl = perplexity(logprobs[s, :len(kept.scored_ids)].tolist())
                for _ in range(n // per_row):
                    out.completions.append(kept.text)
                    out.perplexity.append(ppl)
                    out.n_tokens.append(kept.n_tokens)
                    out.token_ids.append(kept.scored_ids)
            results.append(out)
        return results

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        return [s.loss for s in self.reference_scores(prompts, references)]

    def reference_scores(self, prompts: list[str], references: list[str]) -> list[RefScores]:
        import torch

        out = []
        with torch.inference_mode():
            for prompt, ref in zip(prompts, references):
                got = scorable_reference(self.tok, prompt, ref, self.max_positions, self.stats)
                if isinstance(got, str):
                    out.append(RefScores.unscorable([got]))
                    continue
                out.append(self._score(*got))
        return out

    def _score(self, ids: list[int], n_ctx: int) -> RefScores:
        import torch

        n_ctx = max(1, n_ctx)  # the first token has no prediction (reference_tokens keeps one context token)
        inputs = torch.tensor([ids], device=self.device)
        # only the positions that predict a scored token: logits over the whole context would
        # cost len(ids) x vocabulary memory for nothing
        keep_n = len(ids) - n_ctx + 1
        extra = {"logits_to_keep": keep_n} if self._keeps_logits else {}
        logits = self.model(input_ids=inputs, **extra).logits[0, -keep_n:-1]
        target = inputs[0, n_ctx:]
        logp = torch.log_softmax(logits.float(), dim=-1)  # [T, V]
        tok_lp = logp.gather(-1, target[:, None]).squeeze(-1)
        p = logp.exp()
        plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))  # 0 log 0 = 0 (masked vocabulary)
        mu = plogp.sum(-1)
        # E[(log p - mu)^2] rather than E[(log p)^2] - mu^2: same value, no cancellation
        dev = torch.where(p > 0, logp - mu[:, None], torch.zeros_like(p))
        sigma = (p * dev * dev).sum(-1).clamp_min(0).sqrt()
        # vLLM's definition (Logprob.rank - 1): a tie counts against the reference token
        rank = (logp >= tok_lp[:, None]).sum(-1) - 1
        return scores_from_logprobs(tok_lp.tolist(), mu.tolist(), sigma.tolist(), rank.tolist())
