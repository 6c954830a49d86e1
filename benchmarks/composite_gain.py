"""Does the text-only composite beat its best input? Several dose sweeps of the same leak with
different member splits (`--set benchmark.fold_seed=N`), read side by side.

    python benchmarks/composite_gain.py OUT_SEED0 OUT_SEED1 ... [--composite text_combined] [--refit]

Each OUT is a `bench_dose_sweep.py --output` directory. Prints, per dose, every black-box single
detector's target AUC on each split and its mean over splits, the composite's, and two gains:
over the best single detector *of each split* (a maximum over noisy siblings, picked after
seeing the target: biased upward) and over the best *fixed* single detector (the one with the
highest mean over the splits): the detector an auditor would have to choose before the audit.

Where every sweep has dose 0 (the control: no member inserted, `'leak.doses=[0,4,16]'`), the same
table again with each AUC net of its split's control (AUC - AUC at dose 0 + 0.5): a split whose
member fold happens to differ from its non-member fold (length, difficulty) moves every dose's
AUC, the control's too, and this takes that out.

``--refit`` also reads each run's stored collections (shadow and target) and prints, per split and
dose: the solution and question probes' calibrations averaged (each standardised on the shadow),
against the oracle reference, against tiny-alt, and all four; ``text_combined`` fitted on the shadow
with each combiner (what ``auto`` did not choose); ``leakray_combined`` (``auto``) fitted with and
without the question probe's columns.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def split_aucs(out: Path) -> tuple[dict, dict]:
    """(dose -> detector -> AUC, the sweep's overrides) of one bench_dose_sweep output."""
    (sweep,) = Path(out).glob("dose-sweep-*")
    curve = json.loads((sweep / "detectability.json").read_text())
    got: dict[int, dict[str, float]] = {}
    for dose, run in curve["runs"].items():
        report = json.loads((Path(run) / "report.json").read_text())
        got[int(dose)] = {n: m["auc"] for n, m in report["detectors"].items() if m.get("auc") is not None}
    bench = Path(out) / "bench_dose_sweep.json"
    return got, (json.loads(bench.read_text())["overrides"] if bench.exists() else [])


def gains(splits: list[dict], composite: str) -> dict:
    """dose -> {singles: name -> [AUC per split], composite: [...], per-split and fixed gains}."""
    from leakray.detect import registry

    out = {}
    for dose in sorted(set.intersection(*(set(s) for s in splits))):
        names = set.intersection(*(set(s[dose]) for s in splits))
        singles = sorted(n for n in names if n in registry.names() and registry.spec(n).access == "black box"
                         and registry.spec(n).family != "composite")
        per = {n: [s[dose][n] for s in splits] for n in singles}
        comp = [s[dose][composite] for s in splits]
        mean = {n: sum(v) / len(v) for n, v in per.items()}
        fixed = max(mean, key=mean.get)
        best_each = [max(per[n][i] for n in singles) for i in range(len(splits))]
        out[dose] = {"singles": per, "composite": comp, "fixed_best": fixed,
                     "gain_over_best_of_each_split": [round(c - b, 3) for c, b in zip(comp, best_each)],
                     "gain_over_fixed_best": round(sum(comp) / len(comp) - mean[fixed], 3)}
    return out


def net_of_control(splits: list[dict]) -> list[dict] | None:
    """Each split's AUCs at the doses above 0 minus its dose-0 control, plus 0.5; None without one."""
    if not all(0 in s for s in splits):
        return None
    return [{dose: {n: auc - s[0][n] + 0.5 for n, auc in row.items() if n in s[0]} for dose, row in s.items() if dose}
            for s in splits]


def render(result: dict, composite: str, labels: list[str]) -> str:
    lines = []
    for dose, r in result.items():
        lines += [f"dose {dose}", "", "| detector | " + " | ".join(labels) + " | mean |",
                  "|---|" + "---|" * (len(labels) + 1)]
        rows = sorted(r["singles"].items(), key=lambda kv: -sum(kv[1]))
        for name, v in [(f"**{composite}**", r["composite"]), *rows]:
            mark = " (best fixed)" if name == r["fixed_best"] else ""
            lines.append(f"| {name}{mark} | " + " | ".join(f"{a:.3f}" for a in v) + f" | {sum(v) / len(v):.3f} |")
        lines += ["", f"{composite} minus the best single of each split: "
                  + ", ".join(f"{g:+.3f}" for g in r["gain_over_best_of_each_split"])
                  + f"; mean minus the best fixed single ({r['fixed_best']}): {r['gain_over_fixed_best']:+.3f}", ""]
    return "\n".join(lines)


# the calibrated sampled probes, solution and question, against each reference model
ORACLE_PAIR = ("next_token_calibrated", "question_next_token_calibrated")
NONORACLE_PAIR = ("next_token_calibrated_nonoracle", "question_next_token_calibrated_nonoracle")


def refits(run: Path) -> dict:
    """Target AUCs of one dose run's refits (module docstring, ``--refit``)."""
    import pyarrow.parquet as pq
    from sklearn.metrics import roc_auc_score

    from leakray.detect import registry
    from leakray.schema import C

    shadow, target = (pq.read_table(run / f"collect_{r}" / "collection.parquet") for r in ("shadow", "target"))
    y = target.column(C.MEMBER).to_numpy()
    z = {}  # each calibrated probe's target score, standardised on the shadow
    for name in (*ORACLE_PAIR, *NONORACLE_PAIR):
        d = registry.make(name)
        ref = d.score(shadow)
        z[name] = (d.score(target) - ref.mean()) / ref.std()
    out = {label: roc_auc_score(y, sum(z[n] for n in names)) for label, names in
           (("pair", ORACLE_PAIR), ("nonoracle pair", NONORACLE_PAIR), ("four", ORACLE_PAIR + NONORACLE_PAIR))}
    for comb in ("logistic", "unit", "pooled"):
        out[f"text_combined {comb}"] = roc_auc_score(y, registry.make("text_combined", {"combiner": comb})
                                                     .fit(shadow, 0).score(target))
    question = [C.QUESTION_CUTS, C.QUESTION_DRAWS, C.REFMODEL_QUESTION_DRAWS, C.REFALT_QUESTION_DRAWS]
    for label, (s, t) in (("with", (shadow, target)),
                          ("without", (shadow.drop_columns(question), target.drop_columns(question)))):
        out[f"leakray_combined {label} question"] = roc_auc_score(y, registry.make("leakray_combined")
                                                                  .fit(s, 0).score(t))
    return out


def render_refits(outputs: list[str], labels: list[str]) -> str:
    lines = ["| split | dose | " + " | ".join(("solution + question: oracle / tiny-alt / all four calibrations",
                                               "text_combined logistic / unit / pooled",
                                               "leakray_combined with / without question")) + " |",
             "|---|---|---|---|---|"]
    for out, label in zip(outputs, labels):
        (sweep,) = Path(out).glob("dose-sweep-*")
        runs = json.loads((sweep / "detectability.json").read_text())["runs"]
        for dose, run in sorted(runs.items(), key=lambda kv: int(kv[0])):
            r = refits(Path(run))
            combiners = " / ".join(f"{r[f'text_combined {c}']:.3f}" for c in ("logistic", "unit", "pooled"))
            lines.append(f"| {label} | {dose} | {r['pair']:.3f} / {r['nonoracle pair']:.3f} / {r['four']:.3f} | "
                         f"{combiners} | {r['leakray_combined with question']:.3f} / "
                         f"{r['leakray_combined without question']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outputs", nargs="+")
    ap.add_argument("--composite", default="text_combined")
    ap.add_argument("--refit", action="store_true", help="refit the composites on the stored collections")
    args = ap.parse_args()
    read = [split_aucs(Path(o)) for o in args.outputs]
    labels = [next((o.split("=", 1)[1] for o in ov if o.startswith("benchmark.fold_seed=")), "0") for _, ov in read]
    result = gains([r for r, _ in read], args.composite)
    print(render(result, args.composite, [f"split {x}" for x in labels]))
    net = net_of_control([r for r, _ in read])
    if net is not None:
        print("Net of each split's dose-0 control (AUC - control + 0.5):\n")
        print(render(gains(net, args.composite), args.composite, [f"split {x}" for x in labels]))
    if args.refit:
        print(render_refits(args.outputs, labels))


if __name__ == "__main__":
    main()
