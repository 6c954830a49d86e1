"""A collection against the compute limit: each part of leakray's collection beside a bare
reference loop over the same prompts, samples and tokens with the same model, in one process.

Parts and their bare references:
- sampling: the sample stage as a collection runs it (batches of 8 tasks; each kind of
  generation one call of `leakray.models.decode` per batch, stop strings, per-task seeds) vs
  `model.generate` over batches of prompts, k samples each, no stop strings; compared per
  generated token (leakray's kept tokens), since the bare loop does not stop at the function's end;
- reference scoring: the sampler's per-task teacher-forced scores vs one batched forward pass;
- upper-case completions (BUZZER-b): as sampling, on the upper-cased prompts;
- AdvPrompt: one greedy completion per variant vs greedy `model.generate` over the variants;
- probes (prefix, mask, greedy): greedy continuations vs greedy `model.generate` of the same texts;
- execution: the sandbox stage vs plain `python -c` per program (no isolation, no harness);
- CodeBLEU / edit distance: the score stage vs `codebleu.calc_codebleu` alone;
- embedding: the embed stage (sliding windows) vs the encoder's forward pass over the same texts
  (completions, references, AdvPrompt completions) in batches of 64, truncated to one window.

    python benchmarks/bench_collect.py [--tasks 24] [--k 5] [--max-new-tokens 128] [--model PATH]

The model defaults to the demo's base (pretrained and cached on first use). Prints one row
per part: leakray's seconds, the bare loop's, and their ratio (the issue's target: the total
within 1.5x of the bare loops)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=24)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="prompts per generate call in the bare loop")
    ap.add_argument("--model", default=None, help="model directory (default: the demo's cached base)")
    args = ap.parse_args()

    import torch

    from leakray.config import SimulateConfig
    from leakray.data.registry import load_benchmark
    from leakray.data.tasks import continuation, generation_prompt, program_of
    from leakray.models.offline import ensure_base_model
    from leakray.perturb.case import uppercase_prompt
    from leakray.protocols.simulate import collect_config
    from leakray.schema import C, T
    import pyarrow as pa

    from leakray.stages.collect import input_table
    from leakray.stages.embed import EmbedStage
    from leakray.stages.execute import ExecuteStage
    from leakray.stages.rows import PARTS
    from leakray.stages.sample import SampleStage
    from leakray.stages.score import score_stage

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model_path = args.model or str(ensure_base_model()[0])
    tasks = load_benchmark("humaneval")[: args.tasks]
    from transformers import AutoTokenizer as _Tok

    _counter = _Tok.from_pretrained(model_path)
    tok_of = lambda text: _counter(text)["input_ids"]  # noqa: E731  (leakray's kept tokens, counted again)
    cfg = SimulateConfig()
    ccfg = collect_config(cfg.model_copy(update={"sample": cfg.sample.model_copy(
        update={"k": args.k, "max_new_tokens": args.max_new_tokens})}), model_path)
    ccfg.extra.upper_case, ccfg.extra.advprompt, ccfg.extra.reference_model = True, True, None
    ccfg.extra.probes = ("prefix", "mask", "greedy")
    table = input_table(tasks, {}, {t[T.TASK_ID] for t in tasks[::2]})
    # AdvPrompt's variants as the perturb stage makes them (not proven in the sandbox here: the
    # proof decides which slots stay, not what a generation costs)
    from leakray.perturb.core import variants_of

    adv_rows = [[t[T.PROMPT]] + [getattr(v, "prompt", "") for v in variants_of(t)] for t in tasks]
    table = table.append_column(C.ADV_PROMPTS, pa.array(adv_rows, pa.list_(pa.string())))
    rows = []

    # -- leakray: the sample stage as the collection runs it (batches of 8 tasks, each kind of
    # generation one batched call per batch), then the other stages ------------------------------
    sample = SampleStage(model_path, ccfg.sample, ccfg.extra)
    sampler = sample.sampler
    prompts, refs = table.column(C.PROMPT).to_pylist(), table.column(C.REFERENCE).to_pylist()
    langs, keys = table.column(C.LANGUAGE).to_pylist(), table.column(C.TASK_ID).to_pylist()
    sampled = pa.concat_tables([sample(table.slice(i, ccfg.batch_size))
                                for i in range(0, table.num_rows, ccfg.batch_size)])
    kinds = sample.kind_seconds
    t_sample, t_upper, t_adv = kinds["sample"], kinds["upper"], kinds["adv"]
    t_probes = kinds["prefix"] + kinds["mask"] + kinds["greedy"]
    part_s = [sum(r[j] for r in sampled.column(C.PART_SECONDS).to_pylist()) for j in range(len(PARTS))]
    t_ref = part_s[PARTS.index("reference")]
    n_tok = sum(sum(r) for r in sampled.column(C.N_TOKENS).to_pylist())
    n_tok_upper = sum(len(tok_of(c)) for r in sampled.column(C.UPPER_COMPLETIONS).to_pylist() for c in r)
    adv_done = [c for r in sampled.column(C.ADV_COMPLETIONS).to_pylist() for c in r]
    n_tok_adv = sum(len(tok_of(c)) for c in adv_done if c)
    probe_texts = [c for name in (C.PREFIX_COMPLETIONS, C.MASK_COMPLETIONS)
                   for r in sampled.column(name).to_pylist() for c in r] + \
        sampled.column(C.GREEDY_COMPLETION).to_pylist()
    n_tok_probes = sum(len(tok_of(c)) for c in probe_texts if c)
    execute = ExecuteStage(ccfg.execute_timeout_s, ccfg.execute_threads, ccfg.allow_weak_isolation)
    executed, t_exec = timed(lambda: execute(sampled))
    scored, t_score = timed(lambda: score_stage(executed))
    embed = EmbedStage(ccfg.embed_model, ccfg.embed_max_tokens, ccfg.embed_stride, ccfg.embed_batch_size, "cpu")
    _, t_embed = timed(lambda: embed(scored))

    # -- bare loops ---------------------------------------------------------------------------------
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()

    def bare_generate(texts, greedy=False, max_new_tokens=args.max_new_tokens):
        made = 0
        decoding = dict(do_sample=False) if greedy else dict(
            do_sample=True, temperature=cfg.sample.temperature, top_p=cfg.sample.top_p, top_k=0,
            num_return_sequences=args.k)
        with torch.inference_mode():
            for i in range(0, len(texts), args.batch):
                enc = tok([generation_prompt(t) for t in texts[i:i + args.batch]], return_tensors="pt", padding=True)
                out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, **decoding)
                made += int((out[:, enc["input_ids"].shape[1]:] != tok.pad_token_id).sum())
        return made

    bare_tok, b_sample = timed(lambda: bare_generate(prompts))
    bare_tok_upper, b_upper = timed(lambda: bare_generate([uppercase_prompt(p, lang)
                                                            for p, lang in zip(prompts, langs)]))
    bare_tok_adv, b_adv = timed(lambda: bare_generate([q for r in adv_rows for q in r if q], greedy=True))
    from leakray.features import probes as pr

    probe_inputs = [pr.given_and_target(p, r, c)[0] for p, r in zip(prompts, refs)
                    for c in pr.prefix_cuts(p, r) + [at for at, _ in pr.mask_spans(p, r)]]
    bare_tok_probes, b_probes = timed(lambda: bare_generate(probe_inputs, greedy=True,
                                                            max_new_tokens=ccfg.extra.probe_tokens)
                                      + bare_generate(prompts, greedy=True))

    def bare_score():
        with torch.inference_mode():
            for i in range(0, len(prompts), args.batch):
                texts = [generation_prompt(p) + continuation(p, r) for p, r in
                         zip(prompts[i:i + args.batch], refs[i:i + args.batch])]
                enc = tok(texts, return_tensors="pt", padding=True)
                logits = model(**enc).logits[:, :-1]
                torch.log_softmax(logits.float(), -1).gather(-1, enc["input_ids"][:, 1:, None])

    _, b_ref = timed(bare_score)
    completions = scored.column(C.COMPLETIONS).to_pylist()
    tests = table.column(T.TESTS).to_pylist()
    entry = [t[T.ENTRY_POINT] for t in tasks]

    def bare_exec():
        for p, comps, test, ep in zip(prompts, completions, tests, entry):
            for c in comps:
                prog = program_of(p, c) + "\n" + test + f"\ncheck({ep})\n"
                subprocess.run([sys.executable, "-c", prog], capture_output=True, timeout=ccfg.execute_timeout_s)

    _, b_exec = timed(bare_exec)

    def bare_codebleu():
        from codebleu import calc_codebleu

        for p, comps, r in zip(prompts, completions, refs):
            for c in comps:
                calc_codebleu([continuation(p, r)], [c], lang="python")

    _, b_score = timed(bare_codebleu)

    def bare_embed():
        from transformers import AutoModel

        from leakray.models.encoders import resolve_encoder

        path = resolve_encoder(ccfg.embed_model)
        enc_tok, enc_model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
        # what the embed stage embeds: the k completions, the references, the AdvPrompt completions
        texts = [c for comps in completions for c in comps] + [continuation(p, r) for p, r in zip(prompts, refs)] \
            + [c for c in adv_done if c]
        with torch.inference_mode():
            for i in range(0, len(texts), 64):
                batch = enc_tok(texts[i:i + 64], return_tensors="pt", padding=True, truncation=True,
                                max_length=ccfg.embed_max_tokens)
                enc_model(**batch)

    _, b_embed = timed(bare_embed)

    per_tok = lambda s, n: s / max(1, n)  # noqa: E731
    rows = [
        ("sampling (s per 1k tokens)", 1e3 * per_tok(t_sample, n_tok), 1e3 * per_tok(b_sample, bare_tok)),
        ("reference scoring", t_ref, b_ref),
        ("upper-case (s per 1k tokens)", 1e3 * per_tok(t_upper, n_tok_upper), 1e3 * per_tok(b_upper, bare_tok_upper)),
        ("AdvPrompt (s per 1k tokens)", 1e3 * per_tok(t_adv, n_tok_adv), 1e3 * per_tok(b_adv, bare_tok_adv)),
        ("probes (s per 1k tokens)", 1e3 * per_tok(t_probes, n_tok_probes), 1e3 * per_tok(b_probes, bare_tok_probes)),
        ("execution", t_exec, b_exec),
        ("CodeBLEU + edit distance", t_score, b_score),
        ("embedding", t_embed, b_embed),
    ]
    print(f"\n{args.tasks} HumanEval tasks, k={args.k}, max_new_tokens={args.max_new_tokens}, model {model_path}")
    print(f"tokens generated: leakray {n_tok} (+{n_tok_upper} upper-case, {n_tok_adv} AdvPrompt, {n_tok_probes} probes), "
          f"bare {bare_tok} (+{bare_tok_upper}, {bare_tok_adv}, {bare_tok_probes}); leakray counts the tokens it keeps")
    print(f"{'part':<30}{'leakray':>10}{'bare':>10}{'ratio':>8}")
    for name, a, b in rows:
        print(f"{name:<30}{a:>10.2f}{b:>10.2f}{a / b if b else float('nan'):>8.2f}")
    total = t_sample + t_ref + t_upper + t_adv + t_probes + t_exec + t_score + t_embed
    scaled = lambda b, n, bare_n: b * n / max(1, bare_n)  # noqa: E731
    bare_total = (scaled(b_sample, n_tok, bare_tok) + b_ref + scaled(b_upper, n_tok_upper, bare_tok_upper)
                  + scaled(b_adv, n_tok_adv, bare_tok_adv) + scaled(b_probes, n_tok_probes, bare_tok_probes)
                  + b_exec + b_score + b_embed)
    print(f"{'total (s; bare sampling scaled to the same tokens)':<50}{total:>8.1f}{bare_total:>8.1f}"
          f"{total / bare_total:>8.2f}")


if __name__ == "__main__":
    main()
