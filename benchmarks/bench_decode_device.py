"""leakray's HF sampling loop against `model.generate`, on one device, side by side in one run:

    python benchmarks/bench_decode_device.py [--device cuda] [--size demo|gpt2-small] [--dtype float32]
                                             [--tasks 32] [--k 5] [--max-new-tokens 128]

The sample stage's work (batches of 8 tasks, k samples each, temperature 0.8 / top-p 0.95,
per-task seeds, stop strings) through `HFSampler.sample`, with leakray's ragged attention
(`models/ragged_attention.py`) and with transformers' SDPA, against the bare reference:
`model.generate` over the same batches (left padded, `num_return_sequences=k`, no stop
strings). Tokens are counted as generated: leakray's kept tokens (each completion cut at its
function's end; the decode loop may run a few past the cut), generate's tokens up to EOS. The
model is a GPT-2 with random weights (throughput does not depend on what the weights learnt):
`demo` is the demo's base shape (4 layers x 256), `gpt2-small` GPT-2's 12 x 768. Prompts are
stdlib functions' signatures and docstrings, HumanEval's shape. Needs torch and transformers
only, so it runs on a bare GPU machine."""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SIZES = {"demo": (4, 256, 4), "gpt2-small": (12, 768, 12)}  # layers, width, heads


def stdlib_prompts(n: int) -> list[str]:
    """Signature + docstring of the first n stdlib functions with a docstring of 2+ lines."""
    from leakray.models.offline import stdlib_sources

    out = []
    for src in stdlib_sources(4_000_000):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.col_offset == 0 and ast.get_docstring(node) \
                    and node.body[0].end_lineno - node.body[0].lineno >= 2:
                out.append("".join(lines[node.lineno - 1: node.body[0].end_lineno]))
                if len(out) == n:
                    return out
    return out


def build(size: str, out: Path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from leakray.models.offline import stdlib_sources, train_tokenizer

    tok = train_tokenizer(stdlib_sources(2_000_000), 4096, out)
    layers, width, heads = SIZES[size]
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=width, n_layer=layers, n_head=heads,
                               bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id)).save_pretrained(out)
    return out


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def leakray_arm(path: Path, args, ragged: bool, prompts: list[str]) -> tuple[float, int]:
    from leakray.models.hf_sampler import HFSampler
    from leakray.models.ragged_attention import use_ragged_attention
    from leakray.models.sampler import SampleConfig

    s = HFSampler(str(path), SampleConfig(k=args.k, max_new_tokens=args.max_new_tokens, seed=0, dtype=args.dtype,
                                          device=args.device, threads=args.threads))
    if ragged:  # the CPU's default; a sampler on a GPU runs SDPA (models/ragged_attention.py)
        use_ragged_attention(s.model, any_device=True)
    else:
        s.model.set_attn_implementation("sdpa")
    s.sample(prompts[:2], ["python"] * 2, ["warm/0", "warm/1"])  # kernels, allocator
    sync(args.device)
    t0, tokens = time.perf_counter(), 0
    for b in range(0, len(prompts), args.batch):
        chunk = prompts[b: b + args.batch]
        got = s.sample(chunk, ["python"] * len(chunk), [f"t/{b + i}" for i in range(len(chunk))])
        tokens += sum(sum(x.n_tokens) for x in got)
    sync(args.device)
    return time.perf_counter() - t0, tokens


def generate_arm(path: Path, args, prompts: list[str]) -> tuple[float, int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leakray.data.tasks import generation_prompt

    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token, tok.padding_side = tok.pad_token or tok.eos_token, "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.device).eval()
    kw = {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "max_new_tokens": args.max_new_tokens,
          "num_return_sequences": args.k, "pad_token_id": tok.pad_token_id}

    def run(chunk):
        enc = tok([generation_prompt(p) for p in chunk], return_tensors="pt", padding=True).to(args.device)
        with torch.inference_mode():
            out = model.generate(**enc, **kw)[:, enc["input_ids"].shape[1]:]
        ended = (out == tok.eos_token_id).int().cumsum(-1) > 0  # EOS and after it do not count
        return int((~ended).sum())

    torch.manual_seed(0)
    run(prompts[:2])
    sync(args.device)
    t0, tokens = time.perf_counter(), 0
    for b in range(0, len(prompts), args.batch):
        tokens += run(prompts[b: b + args.batch])
    sync(args.device)
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", choices=sorted(SIZES), default="demo")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="tasks per call (the sample stage's batch_size)")
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--model", type=Path, help="a causal LM directory (default: a random GPT-2 of --size)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    prompts = stdlib_prompts(args.tasks)
    path = args.model or build(args.size, Path(tempfile.mkdtemp(prefix="bench-decode-")))
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"{args.threads} CPU threads"
    print(f"{len(prompts)} tasks x k={args.k}, max_new_tokens={args.max_new_tokens}, batches of {args.batch}; "
          f"{args.size if not args.model else args.model} {args.dtype} on {args.device} ({name}); "
          f"torch {torch.__version__}", flush=True)
    # each row as its arm finishes: a run stopped at a time limit still shows the arms it finished
    print(f"{'arm':28s} {'seconds':>8s} {'tokens':>7s} {'tokens/s':>9s} {'x bare':>7s}", flush=True)
    bare = None
    for arm, run in [("model.generate (bare)", lambda: generate_arm(path, args, prompts)),
                     ("leakray, ragged attention", lambda: leakray_arm(path, args, True, prompts)),
                     ("leakray, SDPA", lambda: leakray_arm(path, args, False, prompts))]:
        sec, tok = run()
        rate = tok / sec
        bare = bare or rate
        print(f"{arm:28s} {sec:8.2f} {tok:7d} {rate:9.0f} {bare / rate:7.2f}", flush=True)


if __name__ == "__main__":
    main()
