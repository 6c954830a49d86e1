"""Sampling with Hugging Face transformers, through `leakray.models.decode`'s KV-cached loop
(a finished sequence leaves the batch; many tasks share each forward pass).

Prompts that share a key (one task's perturbed variants, AdvPrompt-MIA) are one unit: one
`Request`, seeded by the key (`task_seed`), so the result depends on the task alone and not on
the other tasks decoded beside it (except for the last bits that left padding moves: greedy
tokens on CPU in float32 are the same alone and batched; in bf16 a near-tie argmax may flip).
Sampled variants share the key's random stream, so they depend on which variants come together.
The log-probs behind each perplexity are of the raw model, before temperature and top-p.

`reference_scores` is one forward pass per reference: log_softmax over the scored positions
gives each token's log-prob, Min-K%++'s mean/std of log p over the vocabulary, and the rank."""

from __future__ import annotations

from collections import Counter

from leakray.data.tasks import generation_prompt
from leakray.errors import BadInput
from leakray.models.sampler import (PROMPT_TRUNCATED_LEFT, RefScores, SampleConfig, Samples, keep,
                                    n_completions, perplexity, scorable_reference, scores_from_logprobs,
                                    task_seed)
from leakray.models.host import load_dtype
from leakray.models.kernels import fuse_gelu
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

        from leakray.models.ragged_attention import use_ragged_attention

        torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.stats: Counter = Counter()
        self.device = _device(cfg.device)
        self.tok = AutoTokenizer.from_pretrained(model_path)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.dtype = load_dtype(cfg.dtype, model_path, self.device.type)  # auto: float32 on a CPU
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype).to(self.device).eval()
        fuse_gelu(self.model)
        use_ragged_attention(self.model)  # on the CPU, where this transformers can: SDPA over each row's own columns
        own = getattr(self.model.config, "max_position_embeddings", None) or getattr(
            self.model.config, "n_positions", 4096)
        self.max_positions = min(own, cfg.max_model_len) if cfg.max_model_len else own
        if self.max_positions - cfg.max_new_tokens < 1:
            raise BadInput(f"max_new_tokens={cfg.max_new_tokens} leaves no room for a prompt in the "
                           f"model's {self.max_positions} positions", field="sample.max_new_tokens")
        self.special = set(self.tok.all_special_ids)
        self._token_texts: dict[int, str] = {}  # token id -> its text alone (the next-token probe's draws)

    # the collection stage may hand this sampler a whole batch of tasks per call (see
    # stages.sample.SampleStage): per-prompt degradations are then in each Samples' notes
    batches_tasks = True

    def sample(self, prompts: list[str], languages: list[str], keys: list[str], *,
               k: int | None = None, greedy: bool = False) -> list[Samples]:
        return self._generate(prompts, languages, keys, n_completions(self.cfg, k, greedy), greedy,
                              self.cfg.max_new_tokens)

    def greedy_probe(self, prompts: list[str], languages: list[str], keys: list[str],
                     max_new_tokens: int) -> list[str]:
        got = self._generate(prompts, languages, keys, 1, True, min(max_new_tokens, self.cfg.max_new_tokens))
        return [s.completions[0] for s in got]

    def next_token_draws(self, texts: list[str], keys: list[str], n: int) -> list[list[str]]:
        """One forward pass per key: a key's texts are heads of its longest text (the next-token
        probe's cuts of one program), so that pass's logits at the end of a text's tokens are the
        distribution a one-token request for that text samples from, wherever the text's tokens
        are the head of the longest text's (checked; a text whose are not gets its own pass). The
        ``n`` draws per text come from it with the key's generator: the same draws as ``n``
        sampled one-token continuations, without decoding each."""
        import torch

        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        out: list[list[str]] = [[] for _ in texts]
        with torch.inference_mode():
            for key, idx in groups.items():
                gen = torch.Generator().manual_seed(task_seed(self.cfg.seed, key))
                ids = {i: self._tail(self.tok(texts[i])["input_ids"]) for i in idx}
                full = ids[max(idx, key=lambda i: len(ids[i]))]
                shared = [i for i in idx if ids[i] == full[:len(ids[i])]]
                last = self._next_logits(full, [len(ids[i]) - 1 for i in shared])
                rows = dict(zip(shared, last))
                for i in idx:
                    logits = rows[i] if i in rows else self._next_logits(ids[i], [len(ids[i]) - 1])[0]
                    drawn = torch.multinomial(torch.softmax(logits.float(), -1), n, replacement=True, generator=gen)
                    out[i] = [self._token_text(t) for t in drawn.tolist()]
        return out

    def _tail(self, ids: list[int]) -> list[int]:
        """A text's last tokens that fit the context (its end is what the next token continues)."""
        if len(ids) <= self.max_positions:
            return ids
        self.stats[PROMPT_TRUNCATED_LEFT] += 1
        return ids[len(ids) - self.max_positions:]

    def _next_logits(self, ids: list[int], positions: list[int]):
        import torch

        logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0]
        return logits[torch.tensor(positions, device=self.device)].cpu()

    def _token_text(self, token: int) -> str:
        if token not in self._token_texts:
            self._token_texts[token] = "" if token in self.special else self.tok.decode([token])
        return self._token_texts[token]

    def _prompt_ids(self, prompt: str) -> tuple[list[int], bool]:
        """The prompt's tokens; a prompt too long for the context loses its *oldest* tokens
        (the signature the model must continue is at the end), and that is counted."""
        ids = self.tok(generation_prompt(prompt))["input_ids"]
        room = self.max_positions - self.cfg.max_new_tokens
        if len(ids) <= room:
            return ids, False
        bos = self.tok.bos_token_id
        head = [ids[0]] if bos is not None and ids[0] == bos else []
        self.stats[PROMPT_TRUNCATED_LEFT] += 1
        return head + ids[len(ids) - (room - len(head)):], True

    def _generate(self, prompts: list[str], languages: list[str], keys: list[str], n: int, greedy: bool,
                  max_new_tokens: int) -> list[Samples]:
        """n completions of each prompt. Prompts that share a key and stop strings (one task's
        variants) are one `Request`, seeded by the key; all requests are decoded together."""
        from leakray.models.decode import Request, decode

        groups: dict[tuple, list[int]] = {}  # (key, stop strings) -> prompt indices, in order
        for i, (p, lang, key) in enumerate(zip(prompts, languages, keys)):
            groups.setdefault((key, tuple(stop_strings(p, lang))), []).append(i)
        encoded = [self._prompt_ids(p) for p in prompts]
        # greedy gives one sequence per prompt; n greedy copies are the same sequence repeated
        per_prompt = 1 if greedy else n
        requests = [Request([encoded[i][0] for i in idx], per_prompt, greedy, task_seed(self.cfg.seed, key),
                            max_new_tokens, list(stops)) for (key, stops), idx in groups.items()]
        got = decode(self.model, requests, pad_id=self.tok.pad_token_id, end_ids=self.special,
                     detokenize=lambda ids: self.tok.decode(ids, skip_special_tokens=True),
                     temperature=self.cfg.temperature, top_p=self.cfg.top_p)
        out: list[Samples | None] = [None] * len(prompts)
        for idx, per_req in zip(groups.values(), got):
            for i, seqs in zip(idx, per_req):
                s = Samples([], [], [], [], notes=[PROMPT_TRUNCATED_LEFT] if encoded[i][1] else [])
                for g in seqs:
                    kept = keep(self.tok, g.ids, self.special, prompts[i], languages[i])
                    ppl = perplexity(g.logprobs[:len(kept.scored_ids)])
                    for _ in range(n // per_prompt):
                        s.completions.append(kept.text)
                        s.perplexity.append(ppl)
                        s.n_tokens.append(kept.n_tokens)
                        s.token_ids.append(kept.scored_ids)
                out[i] = s
        return out

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
        # every position's logits: the context's tokens are scored too (`RefScores.context_logprob`)
        every = self.model(input_ids=inputs).logits[0]
        logits = every[n_ctx - 1:-1]
        target = inputs[0, n_ctx:]
        # the context tokens' log-probs without a [n_ctx, V] log-softmax copy: logit - logsumexp
        head = every[: n_ctx - 1].float()
        context = (head.gather(-1, inputs[0, 1:n_ctx, None]).squeeze(-1) - torch.logsumexp(head, -1)).tolist()
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
        return scores_from_logprobs(tok_lp.tolist(), mu.tolist(), sigma.tolist(), rank.tolist(), context=context)
