"""Wall time of a dose-sweep on this machine, per dose and stage, and its detectability curve.

    python benchmarks/bench_dose_sweep.py --output /tmp/dose --set leak.steps=100 --set sample.k=2

Runs `leakray simulate --set leak.mode=dose-sweep` (doses 1, 4, 16 unless --set leak.doses=...)
and prints the seconds each stage took at each dose (from the stage markers), the total, the
curve (dose -> AUC per detector) from the sweep's detectability.json, and a table per detector:
AUC and TPR@5%FPR with their bootstrap 95% intervals at each dose, and its wall time (fit,
threshold and scoring, all seeds, from report.json; for the memory probes also the sampling
pass they add to both collections, from the collect stages' `probe_seconds`).

Run again into the same --output with another detector list (`--set detect.detectors=[...]`)
that needs no other collection passes, and the new sweep adopts the earlier one's pretraining
mixtures and collections and fits only the detectors; the stage times name adopted stages.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    sets = [x for o in ["leak.mode=dose-sweep", *args.overrides] for x in ("--set", o)]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "leakray.cli", "simulate", *sets, "--output", args.output],
                          capture_output=True, text=True)
    total = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    # this sweep's directory: an output directory may hold earlier sweeps (another detector list), whose
    # pretraining mixtures and collections this one adopted (docs/DESIGN.md, "Stages shared between runs")
    sweep = max(Path(args.output).glob("dose-sweep-*/detectability.json"), key=lambda p: p.stat().st_mtime).parent
    curve = json.loads((sweep / "detectability.json").read_text())
    stages = {}
    for dose, run in curve["runs"].items():  # an adopted stage keeps the time of the sweep that made it
        stages[dose] = {p.parent.name + (" (adopted)" if info.get("reused_from") else ""): info["seconds"]
                        for p in Path(run).glob("*/_DONE.json") for info in [json.loads(p.read_text())]}
    out = {"total_seconds": round(total, 1), "overrides": args.overrides, "stage_seconds": stages,
           "auc": {n: m["auc"] for n, m in curve["detectors"].items()}, "doses": curve["doses"],
           "detected_at": {n: m["smallest_dose_detected"] for n, m in curve["detectors"].items()},
           "member_token_share": curve["member_token_share"]}
    out["table"] = detector_table(curve)
    (Path(args.output) / "bench_dose_sweep.json").write_text(json.dumps(out, indent=2))
    (Path(args.output) / "bench_dose_sweep.md").write_text(render(out["table"], curve["doses"]))
    print(f"dose-sweep {curve['doses']}: {total / 60:.1f} min in all ({args.overrides})")
    for dose, st in stages.items():
        print(f"  dose {dose}: " + ", ".join(f"{k} {v:.0f}s" for k, v in sorted(st.items(), key=lambda kv: -kv[1])))
    print((sweep / "detectability.md").read_text())
    print(render(out["table"], curve["doses"]))


PROBE_READERS = {"prefix_completion": "prefix", "masked_span": "mask", "rewrite_preference": "greedy",
                 **{f"{head}{tail}": probe for head, probe in (("next_token", "next"), ("question_next_token", "question"))
                    for tail in ("", "_calibrated", "_calibrated_nonoracle")}}


def detector_table(curve: dict) -> dict:
    """detector -> per dose {auc, auc_ci, tpr, tpr_ci, wall_s, probe_s}."""
    table: dict[str, dict] = {}
    for dose, run in curve["runs"].items():
        report = json.loads((Path(run) / "report.json").read_text())
        costs = (report.get("detectors_full") or {}).get("costs", {})
        probe_s = {}
        for stage in ("collect_shadow", "collect_target"):
            marker = Path(run) / stage / "_DONE.json"
            stats = json.loads(marker.read_text()) if marker.exists() else {}
            for probe, sec in (stats.get("probe_seconds") or stats.get("stats", {}).get("probe_seconds") or {}).items():
                probe_s[probe] = probe_s.get(probe, 0.0) + sec
        for name, m in report["detectors"].items():
            table.setdefault(name, {"family": m.get("family")})[str(dose)] = {
                "auc": m.get("auc"), "auc_ci": m.get("auc_ci"), "tpr": m.get("tpr_at_5fpr"),
                "tpr_ci": m.get("tpr_at_5fpr_ci"), "wall_s": (costs.get(name) or {}).get("wall_s"),
                "probe_s": round(probe_s[PROBE_READERS[name]], 1) if name in PROBE_READERS and probe_s else None}
    return table


def _ci(v, ci) -> str:
    if v is None:
        return "–"
    return f"{v:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and ci[0] is not None else "")


def render(table: dict, doses: list) -> str:
    head = ("| detector | family | " + " | ".join(f"AUC d={d} [95% CI] | TPR@5%FPR d={d} [95% CI]" for d in doses)
            + " | wall s per dose (detector; + probe sampling) |")
    lines = [head, "|---|---|" + "---|---|" * len(doses) + "---|"]
    last = str(doses[-1])
    for name, row in sorted(table.items(), key=lambda kv: -((kv[1].get(last) or {}).get("auc") or 0)):
        cells = []
        for d in doses:
            m = row.get(str(d)) or {}
            cells += [_ci(m.get("auc"), m.get("auc_ci")), _ci(m.get("tpr"), m.get("tpr_ci"))]
        walls = [row.get(str(d)) or {} for d in doses]
        wall = " / ".join("–" if m.get("wall_s") is None else f"{m['wall_s']:.1f}"
                          + (f" + {m['probe_s']:.0f}" if m.get("probe_s") is not None else "") for m in walls)
        lines.append(f"| {name} | {row.get('family') or '–'} | " + " | ".join(cells) + f" | {wall} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
