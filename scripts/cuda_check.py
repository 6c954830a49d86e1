#!/usr/bin/env python
"""What leakray runs on a GPU without vLLM, checked against the same code on the CPU:

    python scripts/cuda_check.py [--device cuda] [--workdir DIR] [--base DIR]

`scripts/gpu_check.py` checks the vLLM path and needs vLLM installed; this one needs only torch
and transformers on a CUDA machine (the HF backend, the fine-tunes, the encoder and the
detectors all take a device). It builds the tiny Llama of gpu_check.py (or takes `--base`) and
a randomly initialised GPT-2 of the demo's shape (fused GELU, Conv1D LoRA) on the same
tokenizer, then, each on `--device` against the CPU or a CPU-free reference on the device:

    reference_scores[M]   per-token reference log-probs, Min-K%++'s mu/sigma and ranks, float32,
                          device vs CPU
    sample_vs_teacher[M]  k sampled completions' perplexities (decode.py's KV-cached batched loop;
                          SDPA on a GPU, ragged attention on the CPU) vs one teacher-forced forward
                          pass on the same tokens
    task_seed[M]          a task's sampled and greedy tokens are the same alone and in a batch
    ragged_attention[M,D] leakray_sdpa (each run of rows reads its own columns; the CPU's default,
                          forced on here) vs plain SDPA: the same greedy tokens, their log-probs
                          within D's tolerance
    bfloat16[M]           bf16 reference scores and sampled perplexities vs float32 on the device
    next_token_draws[M]   the next-token probe's draws, device vs CPU (the same generator)
    finetune[full|lora]   the GPT-2 fine-tuned on the device: it trained there, the same losses as
                          on the CPU, and the saved model loads on the CPU and learnt the texts
    pretrain_mix          continued pretraining on the device, the same losses as on the CPU
    embed                 the sliding-window encoder, device vs CPU (cosine of each embedding)
    cgmia_fit, advprompt_fit  the two trained detectors fitted on the device, planted-signal rows:
                          they find the signal there as on the CPU

With `--device cpu` every comparison runs CPU against CPU: a check of the script itself,
run by the test suite, so the GPU run does not fail on a typo. One line per check as in
gpu_check.py (`PASS`/`FAIL`/`SKIP name detail`, `INFO` lines); exit status 1 on a FAIL.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check import (PROMPTS, REFERENCES, TOLERANCE, Checks, Teacher, _stats, build_base,  # noqa: E402
                       log_ppl_deltas, token_deltas)

# float32 on another device (other kernels, another summation order) vs the CPU, per token (nats)
FP32_DEVICE = 1e-3
K = 5
TEXTS = [p + "    " + body for p, body in zip(PROMPTS, ["return a + b\n", "return len(items) == 0\n",
                                                        "with open(path) as f:\n        return f.read()\n"])]


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_gpt2(base: Path, out: Path):
    """A GPT-2 of the demo's kind (gelu_new, Conv1D, no dropout), random weights, the base's tokenizer."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(base)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tok), n_positions=512, n_embd=128, n_layer=2, n_head=2, bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return True, f"gpt2 2x128 vocab={len(tok)} at {out}", out


def build_encoder(base: Path, out: Path):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(base)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=512)).save_pretrained(out)
    tok.save_pretrained(out)
    return True, f"bert 2x64 at {out}", out


def sampler(path: Path, device: str, dtype: str = "float32", ragged: bool = True):
    from leakray.models.hf_sampler import HFSampler
    from leakray.models.sampler import SampleConfig

    from leakray.models.ragged_attention import use_ragged_attention

    s = HFSampler(str(path), SampleConfig(k=K, max_new_tokens=40, seed=0, dtype=dtype, device=device, threads=4))
    if ragged:  # the CPU's default, checked on the device too (a sampler there runs SDPA)
        use_ragged_attention(s.model, any_device=True)
    else:
        s.model.set_attn_implementation("sdpa")
    return s


KEYS = [f"t/{i}" for i in range(len(PROMPTS))]
LANGS = ["python"] * len(PROMPTS)


def check_models(checks: Checks, device: str, models: dict[str, Path]) -> None:
    for label, path in models.items():
        cpu, dev = sampler(path, "cpu"), sampler(path, device)
        checks.line("INFO", f"attention[{label}]", f"{dev.model.config._attn_implementation} on {dev.device}")

        def reference_scores():
            a, b = dev.reference_scores(PROMPTS, REFERENCES), cpu.reference_scores(PROMPTS, REFERENCES)
            d = token_deltas(a, b)
            dmu = [abs(x - y) for s, t in zip(a, b) for x, y in zip(s.mu, t.mu)]
            dsig = [abs(x - y) for s, t in zip(a, b) for x, y in zip(s.sigma, t.sigma)]
            ranks = [x == y for s, t in zip(a, b) for x, y in zip(s.rank, t.rank)]
            ok = max(d) <= FP32_DEVICE and max(dmu) <= FP32_DEVICE and max(dsig) <= FP32_DEVICE
            return ok, (f"logprob {_stats(d)}; mu max {max(dmu):.1e}; sigma max {max(dsig):.1e}; ranks equal "
                        f"{sum(ranks)}/{len(ranks)} (<= {FP32_DEVICE:g})"), None

        def sample_vs_teacher():
            teacher = Teacher(path, device)
            out = dev.sample(PROMPTS, LANGS, KEYS)
            d = log_ppl_deltas(out, PROMPTS, teacher)
            distinct = sum(len(set(map(tuple, s.token_ids))) for s in out)
            return max(d) <= FP32_DEVICE, f"|d log ppl| {_stats(d)}, {distinct} distinct completions", out

        def task_seed(out):
            alone = dev.sample(PROMPTS[:1], LANGS[:1], KEYS[:1])[0]
            greedy_all = dev.sample(PROMPTS, LANGS, KEYS, greedy=True)[0]
            greedy_alone = dev.sample(PROMPTS[:1], LANGS[:1], KEYS[:1], greedy=True)[0]
            same = sum(a == b for a, b in zip(alone.token_ids, out[0].token_ids))
            ok = same == K and greedy_all.token_ids == greedy_alone.token_ids
            return ok, (f"task t/0 alone vs beside {len(PROMPTS) - 1} others: sampled {same}/{K} the same, "
                        f"greedy {'the same' if greedy_all.token_ids == greedy_alone.token_ids else 'differs'}"), None

        def ragged(dtype):
            a, b = sampler(path, device, dtype), sampler(path, device, dtype, ragged=False)
            ga, gb = a.sample(PROMPTS, LANGS, KEYS, greedy=True), b.sample(PROMPTS, LANGS, KEYS, greedy=True)
            same = [x.token_ids == y.token_ids for x, y in zip(ga, gb)]
            d = [abs(math.log(x.perplexity[0]) - math.log(y.perplexity[0])) for x, y, s in zip(ga, gb, same) if s]
            tol = FP32_DEVICE if dtype == "float32" else TOLERANCE[dtype][1]
            # float32: the same tokens; bf16 may flip a near-tie argmax (hf_sampler's docstring)
            ok = bool(d) and max(d) <= tol and (all(same) or dtype != "float32")
            impl = f"{a.model.config._attn_implementation} vs {b.model.config._attn_implementation}"
            return ok, (f"{impl}: greedy tokens "
                        f"the same for {sum(same)}/{len(same)} prompts; |d log ppl| {_stats(d) if d else '-'} "
                        f"<= {tol:g}"), None

        def bfloat16():
            if device == "cpu":
                return True, "bf16 on the CPU is not what this checks (device cpu)", None
            half, full, teacher = sampler(path, device, "bfloat16"), dev, Teacher(path, device)
            d = token_deltas(half.reference_scores(PROMPTS, REFERENCES), full.reference_scores(PROMPTS, REFERENCES))
            dp = log_ppl_deltas(half.sample(PROMPTS, LANGS, KEYS), PROMPTS, teacher)
            tmax, tmean = TOLERANCE["bfloat16"]
            ok = max(d) <= tmax and sum(d) / len(d) <= tmean and sum(dp) / len(dp) <= tmean
            return ok, (f"reference logprob vs float32 {_stats(d)} <= {tmax:g}/{tmean:g}; sampled |d log ppl| vs "
                        f"float32 teacher {_stats(dp)}, mean <= {tmean:g}"), None

        def next_token_draws():
            texts = [REFERENCES[0][:n] for n in (20, 40, 60)] + [REFERENCES[1][:50]]
            keys = ["t/0"] * 3 + ["t/1"]
            a, b = dev.next_token_draws(texts, keys, 16), cpu.next_token_draws(texts, keys, 16)
            same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
            total = sum(len(r) for r in a)
            return same >= 0.95 * total, f"{same}/{total} draws the same as on the CPU (>= 95%)", None

        checks.run(f"reference_scores[{label}]", reference_scores)
        out = checks.run(f"sample_vs_teacher[{label}]", sample_vs_teacher)
        if out is None:
            checks.line("SKIP", f"task_seed[{label}]", "no samples")
        else:
            checks.run(f"task_seed[{label}]", task_seed, out)
        for dtype in ("float32", "bfloat16"):
            if dtype == "bfloat16" and device == "cpu":
                checks.line("SKIP", f"ragged_attention[{label},{dtype}]", "bf16 is checked on the device only")
                continue
            checks.run(f"ragged_attention[{label},{dtype}]", lambda dtype=dtype: ragged(dtype))
        checks.run(f"bfloat16[{label}]", bfloat16)
        checks.run(f"next_token_draws[{label}]", next_token_draws)


def check_training(checks: Checks, device: str, gpt2: Path, root: Path) -> None:
    import numpy as np

    from leakray.models.finetune import FinetuneConfig, finetune

    for method in ("full", "lora"):
        def run(method=method):
            cfg = FinetuneConfig(method=method, epochs=3, lr=3e-3, lora_dropout=0.0, threads=4)
            on = finetune(gpt2, TEXTS, cfg, root / f"ft-{method}-dev", progress=False, device=device)
            off = finetune(gpt2, TEXTS, cfg, root / f"ft-{method}-cpu", progress=False, device="cpu")
            d = max(abs(a - b) for a, b in zip(on["loss_per_epoch"], off["loss_per_epoch"]))
            before = sampler(gpt2, "cpu").reference_loss(PROMPTS, REFERENCES)
            after = sampler(root / f"ft-{method}-dev", "cpu").reference_loss(PROMPTS, REFERENCES)
            learnt = sum(after) < sum(before)
            ok = on["device"].startswith(device) and d <= 1e-2 and learnt
            return ok, (f"trained on {on['device']}; loss per epoch {on['loss_per_epoch']} vs cpu "
                        f"{off['loss_per_epoch']} (max |d| {d:.1e} <= 1e-2); saved model, on the CPU: reference "
                        f"loss {sum(before) / 3:.2f} -> {sum(after) / 3:.2f}"), None

        checks.run(f"finetune[{method}]", run)

    def pretrain_mix():
        from transformers import AutoTokenizer

        from leakray.leak.mixture import MixConfig
        from leakray.leak.pretrain import continue_pretrain

        tok = AutoTokenizer.from_pretrained(gpt2)
        ids = []
        for t in TEXTS * 8:
            ids += tok(t)["input_ids"] + [tok.eos_token_id]
        seqs = np.asarray(ids[: (len(ids) // 32) * 32], dtype=np.int64).reshape(-1, 32)
        cfg = MixConfig(steps=6, batch_size=2, seq_len=32, lr=3e-3, threads=4)
        on = continue_pretrain(gpt2, seqs, cfg, None, progress=False, device=device)
        off = continue_pretrain(gpt2, seqs, cfg, None, progress=False, device="cpu")
        d = max(abs(a - b) for a, b in zip(on["loss_curve"], off["loss_curve"]))
        ok = on["device"].startswith(device) and d <= 1e-2 and on["final_loss"] < on["first_loss"]
        return ok, (f"trained on {on['device']}; loss {on['loss_curve']} vs cpu {off['loss_curve']} "
                    f"(max |d| {d:.1e} <= 1e-2)"), None

    checks.run("pretrain_mix", pretrain_mix)


def check_features(checks: Checks, device: str, encoder: Path) -> None:
    import numpy as np
    from sklearn.metrics import roc_auc_score

    def embed():
        from leakray.features.embed import SlidingWindowEmbedder

        texts = [*TEXTS, "\n".join(TEXTS * 6)]  # the last is longer than a window: several windows, meaned
        kw = {"max_tokens": 64, "stride": 32, "batch_size": 4}
        a = SlidingWindowEmbedder(str(encoder), device=device, **kw).embed(texts)
        b = SlidingWindowEmbedder(str(encoder), device="cpu", **kw).embed(texts)
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        detail = f"cosine device vs cpu: min {cos.min():.6f} over {len(texts)} texts (>= 0.9999)"
        return cos.min() >= 0.9999, detail, None

    def cgmia_fit():
        from leakray.detect.cgmia import CGMIAConfig, arrays_from_table, fit

        data = _import(ROOT / "tests" / "cgmia_data.py", "cgmia_data")
        train = arrays_from_table(data.synthetic_collection(n=160, seed=0, signal=1.0))
        test = arrays_from_table(data.synthetic_collection(n=160, seed=1, signal=1.0, prefix="u"))
        aucs = {}
        for dev in (device, "cpu"):
            cfg = CGMIAConfig(expert_proj_dim=64, hidden=(64, 32), epochs=15, lr=1e-3, device=dev)
            det = fit(train, cfg, seed=0, progress=False)
            aucs[dev] = roc_auc_score(test["member"], det.predict_proba(test))
        return min(aucs.values()) >= 0.8 and abs(aucs[device] - aucs["cpu"]) <= 0.05, \
            f"held-out AUC {device} {aucs[device]:.3f}, cpu {aucs['cpu']:.3f} (>= 0.8, within 0.05)", None

    def advprompt_fit():
        from leakray.detect import advprompt as ap

        synthetic = _import(ROOT / "tests" / "test_advprompt.py", "test_advprompt").synthetic
        train, test = synthetic(400, seed=0), synthetic(400, seed=1)
        aucs = {}
        for dev in (device, "cpu"):
            det = ap.fit(train, ap.AdvPromptConfig(hidden=(64, 64), epochs=8, device=dev), seed=0)
            aucs[dev] = roc_auc_score(test["member"], det.predict_proba(test))
        return min(aucs.values()) >= 0.8 and abs(aucs[device] - aucs["cpu"]) <= 0.05, \
            f"held-out AUC {device} {aucs[device]:.3f}, cpu {aucs['cpu']:.3f} (>= 0.8, within 0.05)", None

    checks.run("embed", embed)
    checks.run("cgmia_fit", cgmia_fit)
    checks.run("advprompt_fit", advprompt_fit)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="the device under test (cpu: the script checks itself)")
    ap.add_argument("--workdir", type=Path, help="where the checkpoints go (default: a temporary dir, removed)")
    ap.add_argument("--base", type=Path, help="a tiny base built by gpu_check.py (default: build one)")
    ap.add_argument("--steps", type=int, default=300, help="training steps of the tiny base")
    args = ap.parse_args(argv)
    import torch
    import transformers

    checks = Checks()
    print(f"INFO torch {torch.__version__}, transformers {transformers.__version__}, python "
          f"{platform.python_version()}; device {args.device}"
          + (f" ({torch.cuda.get_device_name(0)})" if args.device.startswith("cuda") and torch.cuda.is_available()
             else ""), flush=True)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        checks.line("SKIP", "all", "no CUDA device")
        return 0
    root = args.workdir or Path(tempfile.mkdtemp(prefix="leakray-cuda-check-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        torch.set_num_threads(min(4, os.cpu_count() or 1))
        base = args.base or checks.run("build_base", build_base, root / "base", args.steps, 4)
        if base is None:
            return 1
        gpt2 = checks.run("build_gpt2", build_gpt2, base, root / "gpt2")
        encoder = checks.run("build_encoder", build_encoder, base, root / "encoder")
        check_models(checks, args.device, {"llama": base, "gpt2": gpt2})
        check_training(checks, args.device, gpt2, root)
        check_features(checks, args.device, encoder)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"INFO {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
