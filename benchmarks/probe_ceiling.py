"""What the next-token probe's cuts could read with more than 128 one-token draws.

    python benchmarks/probe_ceiling.py SWEEP_OUT [SWEEP_OUT ...] [--reps 20]

SWEEP_OUT is a `benchmarks/bench_dose_sweep.py` output (its runs keep the target model, and their
reports name the oracle and non-oracle reference models). The sampled probe
(`next_token_calibrated`, `..._nonoracle`) estimates at each cut the probability that the model's
next token writes the reference's next pre-token whole (`features.probes.next_agreement`) from 128
draws, for the target and for a reference model, and averages the log shares' difference over the
cuts. Here the same cuts (`features.probes.next_cuts`) are read from each model's exact next-token
distribution (one forward pass over the program per task and model), per task, mean over the cuts
of target minus reference:

- `exact`: log p(next pre-token), the whole pre-token's probability (the same string event under
  any tokenizer): a probe that read exact probabilities at these cuts;
- `floored`: the probability a one-token draw writes the pre-token whole, floored at the draws'
  resolution 0.5 / (n + 1), n = 128, as `next_log_share` floors a cut where no draw agrees: the
  probe without its sampling noise;
- `draws n=N`: N one-token draws simulated from those probabilities at each cut for both models
  and read as the probe reads them (mean AUC over `--reps` simulations; N = 128 is the probe);
- `top-k`: what an endpoint that returns the top-k log-probabilities of one generated token gives
  (OpenAI's completions: k <= 5; vLLM's server: 20 by default): the agreeing tokens' probability
  when one is among the top k, else the k-th probability (an upper bound); one request of one token
  per cut instead of 128 draws;
- `measured`: the probe itself (this code's detector) on the collection's real draws, at the cuts the
  collection drew (a sweep run with `columns.next_cuts=512` drew at every token start);
- `ref_calibrated`: every token of the solution, exact (the likelihood family's detector; from the
  collection's stored log-probabilities).

One table row per run and reference: target AUC, members against non-members. About 20 s per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DRAWS = (128, 512, 2048)
TOP_K = (5, 20, 100)
FLOOR = np.log(0.5 / 129)  # features.probes.next_log_share with no agreeing draw of 128


def cut_readings(model_dir: str, rows: list[dict]) -> list[dict[int, dict]]:
    """Per task, per probe cut (offset into the continuation) that starts a token of this model's
    tokenizer: {"whole": log p of the next pre-token, "one": log p that one token writes it whole
    (-inf if none can), "top": {k: (log p of the agreeing tokens among the top k or None, the k-th
    log p)}}."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from leakray.data.tasks import continuation, program_of
    from leakray.features.probes import next_cuts, next_pretoken
    from leakray.schema import C

    tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(model_dir) / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    window = model.config.max_position_embeddings
    strings = [tok.decode([i]) for i in range(len(tok))]
    by_first: dict[str, list[int]] = {}  # the tokens a rest can start with, by its first character
    for i, s in enumerate(strings):
        if s:
            by_first.setdefault(s[0], []).append(i)
    out = []
    for r in rows:
        cont = continuation(r[C.PROMPT], r[C.REFERENCE])
        program = program_of(r[C.PROMPT], cont)
        head = len(program) - len(cont)
        enc = tok(program, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"][-window:], enc["offset_mapping"][-window:]
        with torch.inference_mode():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        position = {a: i for i, (a, _) in enumerate(offsets)}
        cuts = {}
        for cut in next_cuts(r[C.PROMPT], r[C.REFERENCE]):
            rest = program[head + cut:]
            need = len(next_pretoken(rest))
            i = position.get(head + cut)
            if i is None or i == 0 or not need:
                continue
            j = i  # the program's tokens inside the next pre-token
            while j < len(ids) and offsets[j][0] < head + cut + need:
                j += 1
            if offsets[j - 1][1] > head + cut + need:  # a token straddles the pre-token's end
                continue
            whole = float(sum(logp[p - 1, ids[p]] for p in range(i, j)))
            dist = logp[i - 1]
            agree = [v for v in by_first.get(rest[0], ()) if len(strings[v]) >= need and rest.startswith(strings[v])]
            one = float(torch.logsumexp(dist[agree], 0)) if agree else -np.inf
            top = torch.topk(dist, max(TOP_K))
            tid, tv = top.indices.tolist(), top.values.tolist()
            reads = {}
            for k in TOP_K:
                hit = [v for t, v in zip(tid[:k], tv[:k]) if t in agree]
                reads[k] = (float(np.logaddexp.reduce(hit)) if hit else None, tv[k - 1])
            cuts[cut] = {"whole": whole, "one": one, "top": reads}
        out.append(cuts)
    return out


def statistics(target: list[dict], reference: list[dict], reps: int, rng) -> dict[str, list]:
    """Per statistic, per task (``draws``: per repetition, per task)."""
    def top(x, k):
        got, bound = x["top"][k]
        return bound if got is None else got

    pairs = [[(t[c], q[c]) for c in t if c in q] for t, q in zip(target, reference)]
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0  # noqa: E731
    stats: dict[str, list] = {
        "exact": [mean([t["whole"] - q["whole"] for t, q in p]) for p in pairs],
        "floored": [mean([max(t["one"], FLOOR) - max(q["one"], FLOOR) for t, q in p]) for p in pairs]}
    for n in DRAWS:
        share = lambda lp: np.log((rng.binomial(n, np.exp(lp)) + 0.5) / (n + 1))  # noqa: E731
        stats[f"draws n={n}"] = [[mean([share(t["one"]) - share(q["one"]) for t, q in p]) for p in pairs]
                                 for _ in range(reps)]
    for k in TOP_K:
        stats[f"top-{k}"] = [mean([top(t, k) - top(q, k) for t, q in p]) for p in pairs]
    return stats


def main() -> None:
    import pyarrow.parquet as pq
    from sklearn.metrics import roc_auc_score

    from leakray.detect import registry
    from leakray.schema import C

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cols = ["ref_calibrated", "exact", "floored", *(f"draws n={n}" for n in DRAWS), *(f"top-{k}" for k in TOP_K)]
    print("| run | dose | reference | " + " | ".join(cols) + " | measured |")
    print("|---" * (len(cols) + 4) + "|")
    for sweep in args.sweeps:
        for coll in sorted(sweep.glob("**/collect_target/collection.parquet")):
            run = coll.parent.parent
            dose = json.loads((run / "config.json").read_text())["leak"]["dose"]
            refs = json.loads((run / "report.json").read_text())["reference_models"]
            rows = [r for r in pq.read_table(coll).to_pylist()
                    if r[C.MEMBER] in (0, 1) and r[C.REF_TOKEN_LOGPROBS] and r[C.REFALT_TOKEN_LOGPROBS]]
            y = np.array([r[C.MEMBER] for r in rows])
            table = pq.read_table(coll)
            keep = np.isin(table.column(C.TASK_ID).to_numpy(zero_copy_only=False), [r[C.TASK_ID] for r in rows])
            table = table.filter(keep)
            target = cut_readings(str(run / "target" / "model"), rows)
            for label, ref_dir, column, detector in (
                    ("oracle", refs["oracle"], C.REFMODEL_TOKEN_LOGPROBS, "next_token_calibrated"),
                    ("non-oracle", refs["nonoracle"], C.REFALT_TOKEN_LOGPROBS, "next_token_calibrated_nonoracle")):
                stats = statistics(target, cut_readings(ref_dir, rows), args.reps, rng)
                stats["ref_calibrated"] = [(np.sum(r[C.REF_TOKEN_LOGPROBS]) - np.sum(r[column]))
                                           / len(r[C.REF_TOKEN_LOGPROBS]) for r in rows]
                auc = lambda s: roc_auc_score(y, s)  # noqa: E731
                cells = [float(np.mean([auc(s) for s in stats[c]])) if c.startswith("draws") else auc(stats[c])
                         for c in cols]
                measured = auc(registry.detector_class(detector)().score(table))
                print(f"| {run.name} | {dose} | {label} | " + " | ".join(f"{c:.3f}" for c in cells)
                      + f" | {measured:.3f} |", flush=True)


if __name__ == "__main__":
    main()
