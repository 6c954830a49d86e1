"""bfloat16 against float32 on the CPU, side by side in one run: the HF sampler's sampling and
reference scoring over the same prompts, the model loaded in each dtype.

    python benchmarks/bench_cpu_dtype.py [--size gpt2-small] [--threads 2]

Why `sample.dtype: auto` loads a 16-bit checkpoint as float32 on a CPU (`models.host.load_dtype`).
Measured on this project's 2-core host (AVX2, no AVX512-BF16 or AMX), GPT-2 small's shape with
random weights, 4 tasks x k=5 x 48 new tokens, 8 references: sampling 11.34 s in float32 and
309.17 s in bfloat16 (27x), reference scoring 2.69 s and 181.12 s (67x)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_decode_device import SIZES, build, stdlib_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="gpt2-small")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from leakray.models.hf_sampler import HFSampler
    from leakray.models.sampler import SampleConfig

    path = build(args.size, Path(tempfile.mkdtemp(prefix="bench-cpu-dtype-")))
    prompts = stdlib_prompts(8)
    refs = [p + "    return None\n" for p in prompts]
    print(f"{args.size}, random weights, {args.threads} threads: 4 tasks x k=5 x 48 new tokens; 8 references")
    for dtype in ("float32", "bfloat16"):
        s = HFSampler(str(path), SampleConfig(k=5, max_new_tokens=48, dtype=dtype, device="cpu",
                                              threads=args.threads))
        s.sample(prompts[:1], ["python"], ["warm"])
        t0 = time.perf_counter()
        s.sample(prompts[:4], ["python"] * 4, [f"t/{i}" for i in range(4)])
        t1 = time.perf_counter()
        s.reference_scores(prompts, refs)
        t2 = time.perf_counter()
        print(f"{dtype:9s} sample {t1 - t0:7.2f} s   reference scores {t2 - t1:7.2f} s", flush=True)


if __name__ == "__main__":
    main()
