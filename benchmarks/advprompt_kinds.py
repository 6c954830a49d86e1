"""What each AdvPrompt perturbation kind costs and adds, on a run's stored collections.

    python benchmarks/advprompt_kinds.py RUN_DIR [--seeds 0 1 2 3 4] [--bootstrap 1000]

RUN_DIR is a `leakray simulate` / `leakray demo` run with AdvPrompt's columns (all five kinds).
For every kind alone, every kind left out, and all five, the registry's `advprompt` detector is
fitted on the shadow collection and scored on the target's, as the detect stage does, with the
other kinds' slots masked as missing: what `columns.advprompt_kinds` would have collected (the
kept kinds' greedy completions do not depend on the others'; only a near-tie of another batch's
floating point could differ). Prints the target AUC (median over seeds, with the seed-0 bootstrap
95% interval) and the collection cost kept: the share of AdvPrompt's generated tokens (slot 0,
the task's own prompt, always runs) and of its embedded texts.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def masked(table: pa.Table, kinds: set[str]) -> pa.Table:
    """``table`` with the slots of kinds outside ``kinds`` missing, as attach_variants leaves them."""
    from leakray.perturb.core import SLOTS
    from leakray.schema import C

    keep = [True] + [k in kinds for k, _ in SLOTS]
    rows = [[x if k else "" for x, k in zip(r, keep)] for r in table.column(C.ADV_KIND).to_pylist()]
    return table.set_column(table.column_names.index(C.ADV_KIND), C.ADV_KIND, pa.array(rows, pa.list_(pa.string())))


def cost_share(table: pa.Table, tokenizer, kinds: set[str]) -> tuple[float, float]:
    """(share of AdvPrompt's generated tokens, share of its embedded completions) kept with ``kinds``."""
    from leakray.perturb.core import SLOTS
    from leakray.schema import C

    keep = np.array([True] + [k in kinds for k, _ in SLOTS])
    comps = table.column(C.ADV_COMPLETIONS).to_pylist()
    kinds_col = table.column(C.ADV_KIND).to_pylist()
    tokens = np.array([[len(tokenizer.encode(c)) if k else 0 for c, k in zip(cs, ks)]
                       for cs, ks in zip(comps, kinds_col)])
    present = np.array([[bool(k) for k in ks] for ks in kinds_col])
    return float(tokens[:, keep].sum() / tokens.sum()), float(present[:, keep].sum() / present.sum())


def main() -> None:
    from sklearn.metrics import roc_auc_score
    from transformers import AutoTokenizer

    from leakray.detect import registry
    from leakray.evaluate.metrics import binary_metrics
    from leakray.perturb.core import KINDS
    from leakray.schema import C

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--bootstrap", type=int, default=1000)
    args = ap.parse_args()
    shadow = pq.read_table(args.run_dir / "collect_shadow" / "collection.parquet")
    target = pq.read_table(args.run_dir / "collect_target" / "collection.parquet")
    tokenizer = AutoTokenizer.from_pretrained(args.run_dir / "target" / "model")
    y = target.column(C.MEMBER).to_numpy()
    subsets = [("all", set(KINDS))] + [(f"only {k}", {k}) for k in KINDS] \
        + [(f"without {k}", set(KINDS) - {k}) for k in KINDS] \
        + [(f"{a}+{b}", {a, b}) for a, b in itertools.combinations(KINDS, 2)]
    rows = []
    print(f"{'kinds':<18} {'AUC (median)':>12}  {'seed 0 [95% CI]':<22} {'tokens':>7} {'texts':>6}")
    for name, kinds in subsets:
        s, t = masked(shadow, kinds), masked(target, kinds)
        aucs, ci = [], None
        for seed in args.seeds:
            score = registry.make("advprompt", {}).fit(s, seed).score(t)
            aucs.append(float(roc_auc_score(y, score)))
            if ci is None:
                m = binary_metrics(y, score, score >= np.median(score), n_bootstrap=args.bootstrap)
                ci = m["auc_ci"]
        tok, txt = cost_share(target, tokenizer, kinds)
        rows.append({"kinds": name, "auc_median": float(np.median(aucs)), "aucs": aucs, "auc_ci_seed0": ci,
                     "token_share": tok, "text_share": txt})
        print(f"{name:<18} {np.median(aucs):>12.3f}  {aucs[0]:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]{'':<6} "
              f"{tok:>7.0%} {txt:>6.0%}", flush=True)
    (args.run_dir / "advprompt_kinds.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
