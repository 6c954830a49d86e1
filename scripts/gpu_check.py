#!/usr/bin/env python
"""End-to-end check of the vLLM path on a GPU machine, in a few minutes:

    python scripts/gpu_check.py [--dtype float16] [--workdir DIR] [--cpu-only]

It builds a tiny base LM (a byte-level BPE tokenizer from `leakray.models.offline`, and a
2-layer Llama trained for a few hundred steps on stdlib source: vLLM serves LoRA only for
architectures that implement it, and GPT-2, the demo's base, does not), saves it as a HF
checkpoint, makes two random-init peft LoRA adapters (B nonzero, so they differ), then:

  CPU-checkable (always run)
    build_base           the checkpoint, with its training loss falling
    build_adapters       two adapters, saved in peft's format
    merge_matches_peft   each merged checkpoint (the HF reference) gives peft's unmerged logits
    adapters_differ      on the same tokens, the adapters' log-probs differ by far more than the
                         vLLM tolerance, so the vLLM checks can tell which adapter was applied
    hf_teacher_forcing   the comparison function (teacher-forcing given tokens through HF)
                         reproduces the HF sampler's own perplexities (HF vs HF, 1e-4)
    hf_reference_scores  and the HF sampler's per-token reference log-probs (HF vs HF, 1e-4)
  GPU + vLLM (SKIP, with the reason, where either is missing)
    vllm_engine          one engine, enable_lora, both adapters registered (no merge)
    vllm_sample[X]       n=5 completions per prompt through the LoRARequest of X (base, A, B),
                         sampled at temperature 0.8 / top_p 0.95 with raw log-probs
    vllm_vs_hf_ppl[X]    each completion's perplexity equals HF's (X merged, float32) on the
                         SAME tokens: |log ppl_vllm - log ppl_hf| <= tol_mean; were the
                         log-probs temperature-scaled or the adapter not applied, this fails
    vllm_adapter_applied[X]  and is far from the other adapters' (> 10 x tol_mean)
    vllm_prompt_logprobs[X]  reference_scores from prompt_logprobs vs HF's, per token:
                         max |d| <= tol_max, mean |d| <= tol_mean
    vllm_seed_repro      the same task ids give the same tokens (per-task seeds)

Tolerances (vLLM in --dtype vs HF in float32, per-token log-prob, nats), in TOLERANCE below.
One line per check: `PASS name detail`, `FAIL name detail` or `SKIP name reason`; the exit
status is 1 if anything FAILed, else 0.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

# vLLM (--dtype) against HF in float32, per-token |delta log-prob|: (max, mean)
TOLERANCE = {"float32": (5e-3, 1e-3), "float16": (5e-2, 1e-2), "bfloat16": (2.5e-1, 5e-2)}
HF_VS_HF = 1e-4  # the same model and dtype twice: only reduction order differs
PROMPTS = [
    'def add(a, b):\n    """Return the sum of a and b."""\n',
    'def is_empty(items):\n    """Return True if items has no elements."""\n',
    'def read_lines(path):\n    """Return the lines of the file at path."""\n',
]
REFERENCES = [p + body for p, body in zip(PROMPTS, [
    "    return a + b\n", "    return len(items) == 0\n",
    "    with open(path) as f:\n        return f.read().splitlines()\n"])]
K = 5


class Checks:
    def __init__(self):
        self.failed = 0

    def line(self, status: str, name: str, detail: str) -> None:
        self.failed += status == "FAIL"
        print(f"{status} {name} {detail}", flush=True)

    def run(self, name: str, fn, *args):
        """fn returns (ok, detail, value); an exception is a FAIL. Returns value, or None."""
        t0 = time.perf_counter()
        try:
            ok, detail, value = fn(*args)
        except Exception as exc:  # a check that crashes is a failed check, the rest still run
            self.line("FAIL", name, f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500])
            traceback.print_exc(file=sys.stderr)
            return None
        self.line("PASS" if ok else "FAIL", name, f"{detail} ({time.perf_counter() - t0:.1f}s)")
        return value if ok else None


# ---- the pieces ------------------------------------------------------------------------------------

def build_base(out: Path, steps: int, threads: int):
    """Tokenizer from leakray.models.offline + a tiny Llama trained briefly, saved as HF checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from leakray.models.offline import stdlib_sources, train_tokenizer

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    texts = stdlib_sources(300_000)
    tok = train_tokenizer(texts, 512, out)
    ids = []
    for t in texts:
        ids += tok(t)["input_ids"] + [tok.eos_token_id]
    data = torch.tensor(ids)
    # head_dim 64: a size every vLLM attention backend takes
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 65, (8,), generator=gen)
        batch = torch.stack([data[s: s + 64] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval().save_pretrained(out)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    ok = last < first - 1.0  # a peaked distribution: a misaligned token comparison shows
    return ok, f"llama 2x128 vocab={len(tok)} steps={steps} loss {first:.2f}->{last:.2f} at {out}", out


def build_adapters(base: Path, root: Path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = {}
    for seed, name in ((1, "A"), (2, "B")):
        torch.manual_seed(seed)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
            r=8, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                "up_proj", "down_proj"],
            init_lora_weights=False))  # B random, not zero: the adapter changes the model
        model.save_pretrained(root / f"adapter_{name}")
        paths[name] = root / f"adapter_{name}"
    ok = all((p / "adapter_config.json").exists() and list(p.glob("adapter_model.*")) for p in paths.values())
    return ok, " ".join(f"{n}={p}" for n, p in paths.items()) + " r=8", paths


def merge_all(base: Path, adapters: dict, root: Path):
    """Merged HF checkpoints (the reference), checked against peft's unmerged forward."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from leakray.models.vllm_sampler import merge_adapter

    merged, worst = {None: base}, 0.0
    ids = torch.arange(3, 40)[None]
    for name, path in adapters.items():
        merged[name] = merge_adapter(base, path, root / f"merged_{name}")
        with torch.inference_mode():
            want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(path))(ids).logits
            got = AutoModelForCausalLM.from_pretrained(merged[name])(ids).logits
        worst = max(worst, float((want - got).abs().max()))
    return worst <= HF_VS_HF * 10, f"max |logit delta| {worst:.2e} <= {HF_VS_HF * 10:g}", merged


class Teacher:
    """Per-token log-probs of given tokens after a prompt, by one HF forward pass in float32."""

    def __init__(self, path: Path, device: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device).eval()

    def prompt_ids(self, prompt: str) -> list[int]:
        from leakray.data.tasks import generation_prompt

        return self.tok(generation_prompt(prompt))["input_ids"]

    def logprobs(self, context: list[int], tokens: list[int]) -> list[float]:
        import torch

        ids = torch.tensor([list(context) + list(tokens)], device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0, len(context) - 1: -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(context):, None]).squeeze(-1)
        return lp.tolist()


def log_ppl_deltas(samples, prompts: list[str], teacher: Teacher) -> list[float]:
    """|log perplexity reported - log perplexity teacher-forced on the same tokens|, per completion."""
    out = []
    for s, prompt in zip(samples, prompts):
        ctx = teacher.prompt_ids(prompt)
        for ppl, toks in zip(s.perplexity, s.token_ids):
            lps = teacher.logprobs(ctx, toks)
            out.append(abs(math.log(ppl) + sum(lps) / len(lps)))
    return out


def token_deltas(scores_a, scores_b) -> list[float]:
    """Per-token |delta| of two samplers' reference log-probs (the same scored tokens)."""
    out = []
    for a, b in zip(scores_a, scores_b):
        if a.logprobs is None or b.logprobs is None or len(a.logprobs) != len(b.logprobs):
            raise AssertionError(f"scored tokens differ: {a.notes} / {b.notes}")
        out += [abs(x - y) for x, y in zip(a.logprobs, b.logprobs)]
    return out


def _stats(d: list[float]) -> str:
    return f"max={max(d):.2e} mean={sum(d) / len(d):.2e} n={len(d)}"


# ---- main ------------------------------------------------------------------------------------------

def vllm_ready() -> str | None:
    """None if vLLM can run here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not installed (pip install 'leakray[vllm]')"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float16", choices=sorted(TOLERANCE), help="vLLM's dtype")
    ap.add_argument("--workdir", type=Path, help="where the checkpoints go (default: a temporary dir, removed)")
    ap.add_argument("--steps", type=int, default=300, help="training steps of the tiny base")
    ap.add_argument("--cpu-only", action="store_true", help="skip the vLLM checks even where they could run")
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    tol_max, tol_mean = TOLERANCE[args.dtype]
    root = args.workdir or Path(tempfile.mkdtemp(prefix="leakray-gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    print(f"INFO tolerance vllm[{args.dtype}] vs hf[float32] per-token |d logprob|: max {tol_max:g}, "
          f"mean {tol_mean:g}; hf vs hf {HF_VS_HF:g}; workdir {root}", flush=True)
    try:
        _run(checks, args, root, tol_max, tol_mean)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"INFO {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


def _run(checks: Checks, args, root: Path, tol_max: float, tol_mean: float) -> None:
    from collections import Counter

    from leakray.models.sampler import SampleConfig

    vllm_names = ["vllm_engine", "vllm_sample", "vllm_vs_hf_ppl", "vllm_adapter_applied",
                  "vllm_prompt_logprobs", "vllm_seed_repro"]
    base = checks.run("build_base", build_base, root / "base", args.steps, args.threads)
    adapters = merged = None
    if base:
        adapters = checks.run("build_adapters", build_adapters, base, root)
    if adapters:
        merged = checks.run("merge_matches_peft", merge_all, base, adapters, root)
    if not merged:
        skipped = ["build_adapters", "merge_matches_peft"][2 - (not base) - (not adapters):]
        for name in [*skipped, "adapters_differ", "hf_teacher_forcing", "hf_reference_scores", *vllm_names]:
            checks.line("SKIP", name, "needs the base, adapters and merged checkpoints")
        return
    teachers = {name: Teacher(path) for name, path in merged.items()}
    from leakray.models.hf_sampler import HFSampler

    hf_cfg = SampleConfig(k=K, max_new_tokens=48, seed=0, dtype="float32", threads=args.threads)
    hf_a = HFSampler(str(merged["A"]), hf_cfg)
    hf_samples = hf_a.sample(PROMPTS, ["python"] * len(PROMPTS), [f"t/{i}" for i in range(len(PROMPTS))])

    def adapters_differ():
        d = token_deltas(hf_a.reference_scores(PROMPTS, REFERENCES),
                         HFSampler(str(merged["B"]), hf_cfg).reference_scores(PROMPTS, REFERENCES))
        mean = sum(d) / len(d)
        return mean > 10 * tol_mean, f"references, A vs B per token: mean |d| {mean:.3f} > {10 * tol_mean:g}", None

    def hf_teacher_forcing():
        d = log_ppl_deltas(hf_samples, PROMPTS, teachers["A"])
        return max(d) <= HF_VS_HF, f"HF sampler ppl vs teacher-forced, A, k={K}: {_stats(d)} <= {HF_VS_HF:g}", None

    refs = hf_a.reference_scores(PROMPTS, REFERENCES)

    def hf_reference_scores():
        from leakray.models.sampler import reference_tokens

        d = []
        for prompt, ref, got in zip(PROMPTS, REFERENCES, refs):
            ids, n_ctx = reference_tokens(teachers["A"].tok, prompt, ref, 512, Counter())
            want = teachers["A"].logprobs(ids[:max(1, n_ctx)], ids[max(1, n_ctx):])
            d += [abs(x - y) for x, y in zip(got.logprobs, want)]
        return max(d) <= HF_VS_HF, f"reference_scores vs teacher-forced: {_stats(d)} <= {HF_VS_HF:g}", None

    checks.run("adapters_differ", adapters_differ)
    checks.run("hf_teacher_forcing", hf_teacher_forcing)
    checks.run("hf_reference_scores", hf_reference_scores)

    why = "--cpu-only" if args.cpu_only else vllm_ready()
    if why:
        for name in vllm_names:
            checks.line("SKIP", name, why)
        return
    _run_vllm(checks, args, base, adapters, merged, teachers, hf_cfg, tol_max, tol_mean)


def _run_vllm(checks, args, base, adapters, merged, teachers, hf_cfg, tol_max, tol_mean) -> None:
    from dataclasses import replace

    from leakray.models.hf_sampler import HFSampler
    from leakray.models.vllm_sampler import VLLMSampler

    cfg = replace(hf_cfg, backend="vllm", dtype=args.dtype, temperature=0.8, top_p=0.95, max_model_len=512,
                  gpu_memory_utilization=0.3)
    keys = [f"t/{i}" for i in range(len(PROMPTS))]
    hf_refs = {n: HFSampler(str(p), hf_cfg).reference_scores(PROMPTS, REFERENCES) for n, p in merged.items()}

    def engine():
        s = VLLMSampler(str(base), cfg, adapters={n: str(p) for n, p in adapters.items()},
                        engine_args={"enforce_eager": True})  # no CUDA-graph capture: a faster start
        return s.adapters == {"A": 1, "B": 2}, f"adapters {s.adapters} over {base}", s

    vs = checks.run("vllm_engine", engine)
    if vs is None:
        for name in ["vllm_sample", "vllm_vs_hf_ppl", "vllm_adapter_applied", "vllm_prompt_logprobs",
                     "vllm_seed_repro"]:
            checks.line("SKIP", name, "no engine")
        return
    for name in (None, "A", "B"):
        _check_one(checks, vs.using(name), name, keys, teachers, hf_refs, tol_max, tol_mean)


def _check_one(checks, view, name, keys, teachers, hf_refs, tol_max, tol_mean) -> None:
    """The vLLM checks of one adapter (None: the base) against HF with it merged."""
    label = name or "base"
    langs = ["python"] * len(PROMPTS)

    def sample():
        out = view.sample(PROMPTS, langs, keys)
        ok = all(len(s.completions) == K and all(math.isfinite(p) for p in s.perplexity) for s in out)
        distinct = sum(len(set(map(tuple, s.token_ids))) for s in out)
        return ok, f"{len(out)} prompts x n={K}, {distinct} distinct completions", out

    def vs_hf(out):
        d = log_ppl_deltas(out, PROMPTS, teachers[name])
        return max(d) <= tol_mean, f"|d log ppl| {_stats(d)} <= {tol_mean:g} (T=0.8 top_p=0.95, raw logprobs)", None

    def repro(out):
        again = view.sample(PROMPTS, langs, keys)
        same = [a.token_ids == b.token_ids for a, b in zip(out, again)]
        return all(same), f"{sum(same)}/{len(same)} prompts resampled identically", None

    def prompt_logprobs():
        got = view.reference_scores(PROMPTS, REFERENCES)
        d = token_deltas(got, hf_refs[name])
        ranks = [a == b for g, w in zip(got, hf_refs[name]) if g.rank and w.rank for a, b in zip(g.rank, w.rank)]
        ok = max(d) <= tol_max and sum(d) / len(d) <= tol_mean
        return ok, f"{_stats(d)} <= {tol_max:g}/{tol_mean:g}; ranks equal {sum(ranks)}/{len(ranks)}", got

    def applied(got):
        means = {}
        for other in (None, "A", "B"):
            if other != name:
                d = token_deltas(got, hf_refs[other])
                means[other or "base"] = round(sum(d) / len(d), 4)
        return min(means.values()) > 10 * tol_mean, \
            f"per-token mean |d| vs the other models' HF {means} > {10 * tol_mean:g}", None

    out = checks.run(f"vllm_sample[{label}]", sample)
    if out is None:
        checks.line("SKIP", f"vllm_vs_hf_ppl[{label}]", "no samples")
    else:
        checks.run(f"vllm_vs_hf_ppl[{label}]", vs_hf, out)
        if name == "A":
            checks.run("vllm_seed_repro", repro, out)
    got = checks.run(f"vllm_prompt_logprobs[{label}]", prompt_logprobs)
    if got is None:
        checks.line("SKIP", f"vllm_adapter_applied[{label}]", "no prompt logprobs within tolerance")
    else:
        checks.run(f"vllm_adapter_applied[{label}]", applied, got)


if __name__ == "__main__":
    sys.exit(main())
