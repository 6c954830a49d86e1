"""How many draws the next-token probe needs: exact token probabilities of a dose-sweep target and
of a reference model, then binomial draws simulated at every token of each reference solution.

    python benchmarks/sim_next_token_draws.py DOSE_RUN_DIR [--reference MODEL] [--question [--cuts N]]

DOSE_RUN_DIR is one dose's run directory (`<output>/dose-sweep-*/humaneval-*`, with `folds/` and
`target/model`); the reference defaults to the sweep's oracle base (its `base` stage). Prints the
target's AUC (members D1 vs non-members D2) of the probe's statistic, alone and calibrated, for
each number of cuts and draws, averaged over 5 simulations. It reads log-probabilities, so it
is a design aid, not a detector: the probe itself sees only the draws (docs/LEAK.md quotes its
output on the dose-16 target: 64 cuts, calibrated 0.75 at 16 draws, 0.82 at 32, 0.88 at 128).

With ``--question`` it reads the prompt's tokens too (the question probe's positions) and prints,
at 64 cuts (``--cuts``) and 128 draws, the calibrated statistic over the solution, over the
question, and the two averaged (each standardised), with the exact (no draws) AUC of each region beside them: how
much a composite of the two sampled probes can gain, before a sweep measures it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def token_probs(path: str, tasks: list[dict], question: bool = False) -> list:
    """Each task's reference-continuation tokens' probabilities under the model at ``path``; with
    ``question``, (the prompt's tokens after the first, the continuation's) per task."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leakray.data.tasks import continuation, generation_prompt
    from leakray.schema import T

    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    out = []
    with torch.inference_mode():
        for t in tasks:
            head = generation_prompt(t[T.PROMPT])
            enc = tok(head + continuation(t[T.PROMPT], t[T.REFERENCE]), return_offsets_mapping=True)
            ids, offs = enc["input_ids"][:1024], enc["offset_mapping"][:1024]
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
            lp = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            start = next(i for i, (_, end) in enumerate(offs) if end > len(head))  # first solution token
            probs = np.exp(lp.numpy())
            out.append((probs[:start - 1], probs[start - 1:]) if question else probs[start - 1:])
    return out


def main() -> None:
    from sklearn.metrics import roc_auc_score

    from leakray.data.humaneval import read_humaneval
    from leakray.schema import T

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--reference", default=None, help="reference model (default: the sweep's base in the cache)")
    ap.add_argument("--question", action="store_true", help="the question probe's positions beside the solution's")
    ap.add_argument("--cuts", type=int, default=64, help="cuts per region with --question (default 64, the probes')")
    args = ap.parse_args()
    run = Path(args.run_dir)
    folds = json.loads((run / "folds" / "folds.json").read_text())
    tasks = [t for t in read_humaneval() if folds[t[T.TASK_ID]] in (0, 1)]
    y = np.array([folds[t[T.TASK_ID]] == 0 for t in tasks])
    reference = args.reference or json.loads((run / "base" / "_DONE.json").read_text())["path"]
    rng = np.random.default_rng(0)

    def stat(p: np.ndarray, at: np.ndarray, n: int) -> float:
        return float(np.mean(np.log((rng.binomial(n, p[at]) + 0.5) / (n + 1))))  # as features.probes.next_log_share

    if args.question:
        return regions(y, token_probs(str(run / "target" / "model"), tasks, True),
                       token_probs(reference, tasks, True), stat, args.cuts)
    target, ref = token_probs(str(run / "target" / "model"), tasks), token_probs(reference, tasks)

    for cuts in (64, 128, 256):
        for n in (16, 32, 64, 128):
            alone, calibrated = [], []
            for _ in range(5):
                st, sr = [], []
                for p, q in zip(target, ref):
                    at = np.unique(np.round(np.linspace(0, len(p) - 1, min(cuts, len(p)))).astype(int))
                    st.append(stat(p, at, n))
                    sr.append(stat(q, at, n))
                alone.append(roc_auc_score(y, st))
                calibrated.append(roc_auc_score(y, np.array(st) - np.array(sr)))
            print(f"cuts {cuts:4d}  draws {n:4d}: AUC alone {np.mean(alone):.3f}  calibrated {np.mean(calibrated):.3f}")


def regions(y: np.ndarray, target: list, ref: list, stat, cuts: int = 64) -> None:
    """Calibrated AUC over the solution, the question and both (``cuts`` cuts, 128 draws; 10 simulations)."""
    from sklearn.metrics import roc_auc_score

    def even(p: np.ndarray) -> np.ndarray:
        return np.unique(np.round(np.linspace(0, len(p) - 1, min(cuts, len(p)))).astype(int))

    for r, name in ((1, "solution"), (0, "question")):
        exact = [np.mean(np.log(t[r])) - np.mean(np.log(q[r])) for t, q in zip(target, ref)]
        print(f"exact log-probabilities, {name}: AUC {roc_auc_score(y, exact):.3f}")
    got = {"solution": [], "question": [], "both (standardised, averaged)": []}
    for _ in range(10):
        per = [np.array([stat(t[r], even(t[r]), 128) - stat(q[r], even(q[r]), 128) for t, q in zip(target, ref)])
               for r in (1, 0)]
        both = sum((v - v.mean()) / v.std() for v in per)
        for key, v in zip(got, (*per, both)):
            got[key].append(roc_auc_score(y, v))
    for key, v in got.items():
        print(f"{cuts} cuts x 128 draws, calibrated, {key}: AUC {np.mean(v):.3f}")


if __name__ == "__main__":
    main()
