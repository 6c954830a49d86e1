"""Sampling with Hugging Face transformers: batched, left-padded `generate` with
`num_return_sequences=k`; perplexity from `output_logits` (raw, unwarped — the
`scores` output is already reshaped by temperature and top-p)."""

from __future__ import annotations

import math
import zlib

from leakray.data.tasks import continuation, generation_prompt, program_of
from leakray.models.sampler import SampleConfig, Samples, tokens_covering
from leakray.models.stops import cut_point, stop_strings


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
        self.device = _device(cfg.device)
        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        dtype = getattr(torch, cfg.dtype) if cfg.dtype != "auto" else "auto"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", 4096)

    def sample(self, prompts: list[str], languages: list[str], keys: list[str]) -> list[Samples]:
        out: list[Samples] = []
        for i in range(0, len(prompts), self.cfg.batch_size):
            sl = slice(i, i + self.cfg.batch_size)
            out.extend(self._sample_batch(prompts[sl], languages[sl], keys[sl]))
        return out

    def _sample_batch(self, prompts, languages, keys) -> list[Samples]:
        import torch

        k = self.cfg.k
        torch.manual_seed(self.cfg.seed + zlib.crc32("|".join(keys).encode()))
        room = self.max_positions - self.cfg.max_new_tokens
        prompts = [generation_prompt(p) for p in prompts]
        enc = self.tok(prompts, return_tensors="pt", padding=True, truncation=True, max_length=room)
        enc = {name: t.to(self.device) for name, t in enc.items()}
        with torch.inference_mode():
            gen = self.model.generate(
                **enc, do_sample=True, temperature=self.cfg.temperature, top_p=self.cfg.top_p, top_k=0,
                max_new_tokens=self.cfg.max_new_tokens, num_return_sequences=k,
                output_logits=True, return_dict_in_generate=True,
                stop_strings=sorted({s for lang in languages for s in stop_strings(lang)}),
                tokenizer=self.tok, pad_token_id=self.tok.pad_token_id,
            )
        width = enc["input_ids"].shape[1]
        new_tokens = gen.sequences[:, width:]
        logits = torch.stack(gen.logits, dim=1).float()  # [B*k, T, V], raw
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens[..., None]).squeeze(-1)
        special = set(self.tok.all_special_ids)
        results = []
        for p, (prompt, lang) in enumerate(zip(prompts, languages)):
            texts, ppls, counts, kept = [], [], [], []
            for s in range(p * k, (p + 1) * k):
                ids = new_tokens[s].tolist()
                end = next((j for j, t in enumerate(ids) if t in special), len(ids))  # eos / pad
                ids = ids[:end]
                raw = self.tok.decode(ids, skip_special_tokens=True)
                cut = cut_point(prompt, raw, lang)
                # at least one token: an immediate end-of-sequence has a probability too
                n = max(1, tokens_covering(self.tok, ids, cut) if ids else 1)
                lp = logprobs[s, :n].tolist()
                texts.append(raw[:cut].rstrip() + "\n")
                ppls.append(math.exp(-sum(lp) / len(lp)))
                counts.append(len(ids[:n]))
                kept.append(new_tokens[s, :n].tolist())
            results.append(Samples(texts, ppls, counts, kept))
        return results

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        import torch

        losses = []
        with torch.inference_mode():
            for prompt, ref in zip(prompts, references):
                n_prompt = len(self.tok(generation_prompt(prompt))["input_ids"])
                ids = self.tok(program_of(prompt, continuation(prompt, ref)), return_tensors="pt")["input_ids"]
                ids = ids[:, : self.max_positions].to(self.device)
                labels = ids.clone()
                labels[:, :n_prompt] = -100  # score only the solution, not the shared prompt
                if (labels != -100).sum() == 0:
                    labels = ids.clone()
                losses.append(float(self.model(input_ids=ids, labels=labels).loss))
        return losses
