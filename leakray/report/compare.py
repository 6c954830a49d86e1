"""`leakray compare`: paper-style tables of many simulate runs, rows = benchmarks, columns = detectors.

Inputs are run directories: a finished simulate run (its report.json has a "detectors" key) or
a directory holding such runs one or two levels down (a multi-benchmark run, a runs/ root). A
report.json without a single ``benchmark.name`` (a multi-benchmark summary) is skipped with a
note: its per-benchmark rows come from the run directories under it.

Per metric: the values table (Markdown + CSV, detectors ordered by their mean over benchmarks,
an "average" row = mean over the benchmarks that have the value), then the statistics of the
reference detector against every other detector across benchmarks (leakray.evaluate.stats):
W/D/L, Wilcoxon signed-rank p, Benjamini–Hochberg over the detectors of that metric, Cliff's δ
and its magnitude. A benchmark where either detector has no value is left out of that pair.
With fewer than 2 benchmarks the tables are written and the statistics say
"n/a: needs >= 2 benchmarks" (not an error: one run's table is still useful).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from leakray.errors import BadInput
from leakray.evaluate import stats

METRICS = ("auc", "tpr_at_5fpr", "tpr_at_1fpr", "mcc", "precision", "recall")
REPORT = "report.json"
AVERAGE = "average"
NEEDS_TWO = "n/a: needs >= 2 benchmarks"
STAT_FIELDS = ("detector", "n", "reference_mean", "detector_mean", "mean_diff", "wins", "draws", "losses",
               "wilcoxon_p", "bh_p", "significant", "cliffs_delta", "magnitude", "min_attainable_p", "note")


@dataclass
class Row:
    """One benchmark's report: the table row `key` (the benchmark name, disambiguated when needed)."""

    key: str
    benchmark: str
    run_dir: Path
    report_path: Path
    run: str | None
    detectors: dict = field(repr=False)


def find_reports(dirs: list[str | Path]) -> list[Path]:
    """Every report.json with a "detectors" key at each dir or one/two levels under it."""
    found: dict[Path, None] = {}
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise BadInput("not a directory", path=str(d))
        candidates = [d / REPORT, *sorted(d.glob(f"*/{REPORT}")), *sorted(d.glob(f"*/*/{REPORT}"))]
        hits = [p for p in candidates if p.is_file() and _has_detectors(p)]
        if not hits:
            raise BadInput(f"no {REPORT} with a 'detectors' key here or one/two levels under it "
                           "(is the simulate run finished?)", path=str(d))
        for p in hits:
            found.setdefault(p.resolve(), None)
    return list(found)


def _load(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"not readable JSON ({exc})", path=str(path)) from None
    if not isinstance(obj, dict):
        raise BadInput("not a JSON object", path=str(path))
    return obj


def _has_detectors(path: Path) -> bool:
    return isinstance(_load(path).get("detectors"), dict)


def load_rows(report_paths: list[Path], notes: list[str]) -> list[Row]:
    """One Row per per-benchmark report; same benchmark twice -> "name (run dir)" and a note."""
    rows = []
    for path in report_paths:
        rep = _load(path)
        bench = rep.get("benchmark")
        name = bench.get("name") if isinstance(bench, dict) else None
        if not isinstance(name, str) or not name:
            notes.append(f"skipped {path}: no single benchmark.name (a multi-benchmark summary?)")
            continue
        run = rep.get("run")
        rows.append(Row(name, name, path.parent, path, run if isinstance(run, str) else None, rep["detectors"]))
    if not rows:
        raise BadInput("no per-benchmark report among the inputs", path=", ".join(map(str, report_paths)))
    by_name: dict[str, list[Row]] = {}
    for r in rows:
        by_name.setdefault(r.benchmark, []).append(r)
    for name, same in by_name.items():
        if len(same) < 2:
            continue
        for i, r in enumerate(same):
            r.key = f"{name} ({r.run_dir.name})"
        if len({r.key for r in same}) < len(same):  # same run dir name under different parents
            for r in same:
                r.key = f"{name} ({r.run_dir.parent.name}/{r.run_dir.name})"
        if len({r.key for r in same}) < len(same):
            for i, r in enumerate(same):
                r.key = f"{name} ({r.run_dir.name} #{i + 1})"
        notes.append(f"benchmark '{name}' appears in {len(same)} reports; rows named by run dir: "
                     + ", ".join(r.key for r in same))
    return rows


def _value(row: Row, detector: str, metric: str) -> float:
    entry = row.detectors.get(detector)
    if not isinstance(entry, dict):
        return math.nan
    v = entry.get(metric)
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadInput(f"expected a number or null, got {v!r}", path=str(row.report_path),
                       field=f"detectors.{detector}.{metric}")
    return float(v)


def metric_matrix(rows: list[Row], detectors: list[str], metric: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(columns ordered by mean desc, values [benchmark x detector] with NaN = missing, column means)."""
    values = np.array([[_value(r, d, metric) for d in detectors] for r in rows], dtype=float).reshape(
        len(rows), len(detectors))
    counts = np.isfinite(values).sum(axis=0)
    means = np.where(counts > 0, np.nansum(values, axis=0) / np.maximum(counts, 1), np.nan)
    # mean desc, missing last, name breaks ties (stable across runs)
    order = sorted(range(len(detectors)),
                   key=lambda j: (math.isnan(means[j]), -means[j] if not math.isnan(means[j]) else 0, detectors[j]))
    return [detectors[j] for j in order], values[:, order], means[order]


def metric_statistics(values: np.ndarray, columns: list[str], reference: str, *, draw_tol: float,
                      alpha: float) -> dict:
    """Reference vs every other column across the benchmarks (rows of `values`)."""
    if values.shape[0] < 2:
        return {"status": NEEDS_TWO, "best_baseline": None, "rows": []}
    ref = values[:, columns.index(reference)]
    out_rows = []
    for j, det in enumerate(columns):
        if det == reference:
            continue
        other = values[:, j]
        both = np.isfinite(ref) & np.isfinite(other)
        x, y = ref[both], other[both]
        row = {"detector": det, "n": int(both.sum()), "reference_mean": _mean(x), "detector_mean": _mean(y),
               "mean_diff": _mean(x - y), "wins": None, "draws": None, "losses": None, "wilcoxon_p": None,
               "bh_p": None, "significant": None, "cliffs_delta": None, "magnitude": None,
               "min_attainable_p": None, "note": ""}
        if row["n"]:
            row["wins"], row["draws"], row["losses"] = stats.win_draw_loss(x, y, draw_tol)
            row["cliffs_delta"] = stats.cliffs_delta(x, y)
            row["magnitude"] = stats.magnitude(row["cliffs_delta"])
        test = stats.paired_wilcoxon(x, y)
        row["wilcoxon_p"], row["min_attainable_p"] = test["p"], test["min_attainable_p"]
        if test["reason"]:
            row["note"] = test["reason"]
        out_rows.append(row)
    for row, q in zip(out_rows, stats.bh_adjust([r["wilcoxon_p"] for r in out_rows])):
        row["bh_p"] = q
        row["significant"] = None if q is None else bool(q < alpha)
    baselines = [r for r in out_rows if r["detector_mean"] is not None]
    best = max(baselines, key=lambda r: r["detector_mean"])["detector"] if baselines else None
    return {"status": "ok", "best_baseline": best, "rows": out_rows}


def _mean(a: np.ndarray) -> float | None:
    return float(np.mean(a)) if a.size else None


# ---- writers -------------------------------------------------------------------------------


def _fmt(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) >= 10 ** -digits or v == 0 else f"{v:.1e}"
    return str(v)


def _md_table(header: list[str], body: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in body]
    return "\n".join(lines)


def _csv_cell(v):
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _values_md(keys: list[str], columns: list[str], values: np.ndarray, means: np.ndarray, reference: str) -> str:
    header = ["benchmark"] + [f"**{c}** (ref)" if c == reference else c for c in columns]
    body = [[k, *values[i].tolist()] for i, k in enumerate(keys)] + [[f"**{AVERAGE}**", *means.tolist()]]
    return _md_table(header, body)


def _stats_md(st: dict, reference: str, alpha: float) -> str:
    if st["status"] != "ok":
        return f"Statistics: {st['status']}."
    header = ["detector", "n", f"mean {reference}", "mean det.", "Δ mean", "W/D/L", "Wilcoxon p",
              "BH p", f"BH p < {alpha}", "Cliff's δ", "magnitude", "note"]
    body = []
    for r in st["rows"]:
        wdl = "–" if r["wins"] is None else f"{r['wins']}/{r['draws']}/{r['losses']}"
        note = r["note"]
        if r["detector"] == st["best_baseline"]:
            note = (note + "; " if note else "") + "best baseline"
        body.append([r["detector"], r["n"], r["reference_mean"], r["detector_mean"], r["mean_diff"], wdl,
                     r["wilcoxon_p"], r["bh_p"], r["significant"], r["cliffs_delta"], r["magnitude"] or "–",
                     note or ""])
    return _md_table(header, body)


def _write_csv(path: Path, header: list[str], body: list[list]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows([[_csv_cell(c) for c in r] for r in body])


def _plots(out: Path, metric: str, keys: list[str], columns: list[str], values: np.ndarray,
           means: np.ndarray, reference: str) -> list[str]:
    import matplotlib
    from matplotlib.figure import Figure  # not pyplot: no global figure registry, no backend switch


    lo = -1.0 if metric == "mcc" else 0.0
    files = []
    # heatmap: benchmarks x detectors
    fig = Figure(figsize=(max(6.0, 0.55 * len(columns) + 2), max(3.5, 0.5 * len(keys) + 2.5)), layout="constrained")
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")  # grey = missing
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=lo, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(columns)), columns, rotation=60, ha="right", fontsize=8)
    _bold_reference(ax, reference)
    ax.set_yticks(range(len(keys)), keys, fontsize=8)
    if values.size <= 600:
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                if np.isfinite(values[i, j]):
                    ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if values[i, j] < lo + 0.6 * (1 - lo) else "black")
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_title(f"{metric} per benchmark and detector")
    fig.savefig(out / f"heatmap_{metric}.png", dpi=110)
    files.append(f"heatmap_{metric}.png")
    # grouped bars: one group per detector (ordered by mean), one bar per benchmark, the mean as a marker
    fig = Figure(figsize=(max(6.0, 0.45 * len(columns) * max(1, len(keys)) / 2 + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(keys))
    x = np.arange(len(columns))
    for i, k in enumerate(keys):
        have = np.isfinite(values[i])  # a missing value gets no bar, not a 0 bar
        ax.bar((x - 0.4 + width * (i + 0.5))[have], values[i][have], width, label=k)
    ax.scatter(x, means, marker="_", s=200, color="black", zorder=3, label=AVERAGE)
    ax.set_xticks(x, columns, rotation=60, ha="right", fontsize=8)
    _bold_reference(ax, reference)
    ax.set_ylim(min(lo, 0.0), 1.0)
    ax.set_ylabel(metric)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1.0), loc="upper left")
    ax.set_title(f"{metric} by detector (bars: benchmarks; –: average)")
    fig.savefig(out / f"bars_{metric}.png", dpi=110)
    files.append(f"bars_{metric}.png")
    return files


def _bold_reference(ax, reference: str) -> None:
    for label in ax.get_xticklabels():
        if label.get_text() == reference:
            label.set_fontweight("bold")


def _clean(obj):
    """Strict JSON: NaN -> null, numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return None if math.isnan(obj) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def compare(dirs: list[str | Path], output: str | Path, *, metrics: tuple[str, ...] = METRICS,
            reference: str = "cgmia", detectors: list[str] | None = None, draw_tol: float = 0.005,
            alpha: float = 0.05, plots: bool = True) -> dict:
    """Write the tables, statistics and plots of `dirs` under `output`; returns compare.json's content."""
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics:
        raise BadInput(f"unknown metric(s) {bad}; choose from {', '.join(METRICS)}", field="--metrics")
    if draw_tol < 0:
        raise BadInput(f"must be >= 0, got {draw_tol}", field="--draw-tol")
    if not 0 < alpha < 1:
        raise BadInput(f"must be in (0, 1), got {alpha}", field="--alpha")
    notes: list[str] = []
    rows = load_rows(find_reports(dirs), notes)
    present = sorted({d for r in rows for d in r.detectors})
    if reference not in present:
        raise BadInput(f"unknown reference detector '{reference}'; the reports have: {', '.join(present)}",
                       field="--reference")
    if detectors:
        unknown = [d for d in detectors if d not in present]
        if unknown:
            raise BadInput(f"unknown detector(s) {unknown}; the reports have: {', '.join(present)}",
                           field="--detectors")
        present = sorted(set(detectors) | {reference})
    for r in rows:
        if reference not in r.detectors:
            notes.append(f"'{r.key}' has no '{reference}': left out of every paired statistic")
    keys = [r.key for r in rows]
    if len(rows) < 2:
        notes.append(f"only {len(rows)} benchmark: statistics {NEEDS_TWO}")
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for metric in METRICS:  # a rerun with fewer metrics must not leave the old ones' tables looking current
        for stale in (f"{metric}.md", f"{metric}.csv", f"{metric}_stats.csv", f"heatmap_{metric}.png",
                      f"bars_{metric}.png"):
            (out / stale).unlink(missing_ok=True)
    result = {"reference": reference, "metrics": list(metrics), "draw_tol": draw_tol, "alpha": alpha,
              "n_benchmarks": len(rows), "benchmarks": [
                  {"row": r.key, "benchmark": r.benchmark, "run": r.run, "run_dir": str(r.run_dir),
                   "report": str(r.report_path)} for r in rows],
              "detectors": present, "notes": notes, "tables": {}, "statistics": {}, "files": {}}
    sections = []
    for metric in metrics:
        columns, values, means = metric_matrix(rows, present, metric)
        st = metric_statistics(values, columns, reference, draw_tol=draw_tol, alpha=alpha)
        _write_csv(out / f"{metric}.csv", ["benchmark", *columns],
                   [[k, *values[i].tolist()] for i, k in enumerate(keys)] + [[AVERAGE, *means.tolist()]])
        _write_csv(out / f"{metric}_stats.csv", list(STAT_FIELDS), [[r[f] for f in STAT_FIELDS] for r in st["rows"]])
        images = _plots(out, metric, keys, columns, values, means, reference) if plots else []
        body = (f"## {metric}\n\n{_values_md(keys, columns, values, means, reference)}\n\n"
                + "".join(f"![{metric} {im.split('_')[0]}]({im})\n" for im in images)
                + f"\n### {reference} vs each detector ({metric})\n\n"
                + (f"Best baseline by mean: {st['best_baseline']}.\n\n" if st["best_baseline"] else "")
                + _stats_md(st, reference, alpha) + "\n")
        (out / f"{metric}.md").write_text(body)
        sections.append(body)
        result["tables"][metric] = {
            "columns": columns,
            "rows": {k: dict(zip(columns, values[i].tolist())) for i, k in enumerate(keys)},
            AVERAGE: dict(zip(columns, means.tolist()))}
        result["statistics"][metric] = st
        result["files"][metric] = [f"{metric}.md", f"{metric}.csv", f"{metric}_stats.csv", *images]
    n = len(rows)
    intro = [
        "# leakray compare", "",
        f"Reference detector: **{reference}** (the proposed method), compared with every other detector.",
        f"Metrics: {', '.join(metrics)}. Benchmarks: n = {n} "
        f"({', '.join(f'{r.key} ← `{r.run_dir}`' for r in rows)}).", "",
        "Tables: rows = benchmarks, columns = detectors ordered by their mean over benchmarks; the average "
        "row is the mean over the benchmarks that have a value (– = missing).",
        f"Statistics per metric, across benchmarks: W/D/L of {reference} against the detector (a draw is "
        f"|difference| <= {draw_tol}); two-sided Wilcoxon signed-rank p (scipy.stats.wilcoxon on the paired "
        "differences; zero differences dropped); Benjamini–Hochberg adjusted p over the detectors of that metric "
        "(scipy.stats.false_discovery_control); Cliff's δ of "
        f"{reference} vs the detector with Romano et al.'s magnitude (|δ| < 0.147 negligible, < 0.33 small, "
        "< 0.474 medium, else large). A benchmark where either value is missing is left out of that pair.",
    ]
    if n >= 2:
        intro.append(f"With {n} benchmarks the exact Wilcoxon test cannot give p below {2.0 ** (1 - n):.3g}.")
    if notes:
        intro += ["", "Notes:", *[f"- {s}" for s in notes]]
    (out / "compare.md").write_text("\n".join(intro) + "\n\n" + "\n".join(sections))
    result = _clean(result)
    (out / "compare.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    return result
