"""Top-p sampling's cut with numpy's sort (`leakray.models.decode._top_p`) against the warper's
own torch sort (`_top_p_sorted`), side by side in one process: the same sampler, the same
prompts and seeds, the two arms alternating, CPU seconds per round of sampling, and a check
that both arms sampled the very same completions.

    python benchmarks/bench_top_p.py [--model PATH] [--tasks 32] [--k 5] [--max-new-tokens 160] [--rounds 3]

The model defaults to the demo's base (pretrained and cached on first use); a fine-tuned
model's sharper distributions keep fewer tokens, but the sort is over the whole vocabulary
either way.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a local model directory (default: the demo's base)")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)  # as a sampler actor on one CPU
    import leakray.models.decode as dec
    from leakray.data.registry import load_benchmark
    from leakray.models.backends import make_sampler
    from leakray.models.offline import ensure_base_model
    from leakray.models.sampler import SampleConfig

    arms = {"numpy sort": dec._top_p,
            "torch sort": lambda logits, p: logits if p >= 1.0 else dec._top_p_sorted(logits, p)}
    model = args.model or str(ensure_base_model()[0])
    tasks = load_benchmark("humaneval")[: args.tasks + 8]
    sampler = make_sampler(model, SampleConfig(k=args.k, max_new_tokens=args.max_new_tokens))
    prompts, keys = [t["prompt"] for t in tasks], [t["task_id"] for t in tasks]
    sampler.sample(prompts[:8], ["python"] * 8, keys[:8])  # warm-up, not timed
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    completions: dict[str, list] = {}
    tokens = 0
    for r in range(args.rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            dec._top_p = arms[name]
            t0 = time.process_time()
            out = sampler.sample(prompts[8:], ["python"] * args.tasks, keys[8:])
            seconds[name].append(time.process_time() - t0)
            completions.setdefault(name, [o.completions for o in out])
            tokens = sum(sum(o.n_tokens) for o in out)
    print(f"{args.tasks} HumanEval tasks, k={args.k}, max_new_tokens={args.max_new_tokens}, {tokens} tokens a round, "
          f"model {model}")
    for name, s in seconds.items():
        print(f"{name:<12} CPU s per round {', '.join(f'{x:.2f}' for x in s)}  (sum {sum(s):.2f})")
    print(f"numpy / torch: {sum(seconds['numpy sort']) / sum(seconds['torch sort']):.2f}; "
          f"the same completions: {completions['numpy sort'] == completions['torch sort']}")


if __name__ == "__main__":
    main()
