"""Sampling with Hugging Face transformers; perplexity from `output_logits` (raw, unwarped —
the `scores` output is already reshaped by temperature and top-p).

Each task is one `generate` call of its k sequences, seeded by the task alone (`task_seed`):
sharing a call with other prompts would both draw from one random stream and change the
numerics through left padding, so a task's samples would depend on its batch-mates. No
padding also means no pad/EOS ambiguity. The cost is fewer sequences per call (k)."""

from __future__ import annotations

from collections import Counter

from leakray.data.tasks import generation_prompt
from leakray.errors import BadInput
from leakray.models.sampler import (PROMPT_TRUNCATED_LEFT, SampleConfig, Samples, keep, perplexity,
                                    reference_tokens, task_seed)
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

    def sample(self, prompts: list[str], languages: list[str], keys: list[str]) -> list[Samples]:
        return [self._sample_one(p, lang, key) for p, lang, key in zip(prompts, languages, keys)]

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

    def _sample_one(self, prompt: str, language: str, key: str) -> Samples:
        import torch

        cfg = self.cfg
        ids = torch.tensor([self._prompt_ids(prompt)], device=self.device)
        torch.manual_seed(task_seed(cfg.seed, key))
        with torch.inference_mode():
            gen = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                temperature=cfg.temperature, top_p=cfg.top_p, top_k=0, max_new_tokens=cfg.max_new_tokens,
                num_return_sequences=cfg.k, output_logits=True, return_dict_in_generate=True,
                stop_strings=stop_strings(prompt, language), tokenizer=self.tok,
                pad_token_id=self.tok.pad_token_id,
            )
        new_tokens = gen.sequences[:, ids.shape[1]:]
        logits = torch.stack(gen.logits, dim=1).float()  # [k, T, V], raw
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens[..., None]).squeeze(-1)
        out = Samples([], [], [], [])
        for s in range(new_tokens.shape[0]):
            kept = keep(self.tok, new_tokens[s].tolist(), self.special, prompt, language)
            out.completions.append(kept.text)
            out.perplexity.append(perplexity(logprobs[s, :len(kept.scored_ids)].tolist()))
            out.n_tokens.append(kept.n_tokens)
            out.token_ids.append(kept.scored_ids)
        return out

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        import torch

        losses = []
        with torch.inference_mode():
            for prompt, ref in zip(prompts, references):
                got = reference_tokens(self.tok, prompt, ref, self.max_positions, self.stats)
                if got is None:
                    losses.append(float("nan"))
                    continue
                ids, n_ctx = got
                ids = torch.tensor([ids], device=self.device)
                labels = ids.clone()
                labels[:, :n_ctx] = -100  # score only the continuation, not the shared prompt
                losses.append(float(self.model(input_ids=ids, labels=labels).loss))
        return losses
