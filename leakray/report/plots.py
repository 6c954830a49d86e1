"""Report plots as inline SVG strings (matplotlib, no files, no network).

Figures are built with ``matplotlib.figure.Figure`` rather than pyplot: pyplot keeps every
figure in a global registry until closed, a plain Figure is freed with its last reference,
so a report of many plots leaks nothing. Text stays text in the SVG (``svg.fonttype:
none``): smaller files, and selectable labels."""

from __future__ import annotations

import io
import math
import re
from typing import Mapping, Sequence

import matplotlib
from matplotlib.figure import Figure

# each verdict keeps its colour across every plot and table of a report
VERDICT_COLORS = {"confirmed": "#c0392b", "suspected": "#e67e22", "clean": "#2e8b57",
                  "member": "#c0392b", "non-member": "#2f6db5"}
_SIZE = (6.0, 4.0)
_LEGEND_INSIDE_MAX = 6  # more entries than this go beside the axes, not over the curves
_WIDE = (7.5, 4.2)  # room for a legend beside the axes


def _figure(size=_SIZE) -> tuple[Figure, object]:
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def _colors(n: int) -> list:
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _legend(ax) -> None:
    n = len(ax.get_legend_handles_labels()[0])
    if n > _LEGEND_INSIDE_MAX:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    elif n:
        ax.legend(fontsize=8, loc="best")


def to_svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element ready to inline (XML prologue and DOCTYPE dropped)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    fig.clear()
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(float(x))]


def _auc_label(name: str, auc) -> str:
    return f"{name} (AUC {auc:.3f})" if isinstance(auc, (int, float)) and math.isfinite(auc) else name


def roc_plot(curves: Mapping[str, Mapping[str, Sequence[float]]], aucs: Mapping[str, float] | None = None,
             title: str = "ROC") -> str:
    """One ROC curve per name (``{"fpr": [...], "tpr": [...]}``), AUC in the legend, chance diagonal."""
    fig, ax = _figure(_WIDE if len(curves) > _LEGEND_INSIDE_MAX else _SIZE)
    for (name, c), color in zip(curves.items(), _colors(len(curves))):
        ax.plot(c["fpr"], c["tpr"], color=color, lw=1.4, label=_auc_label(name, (aucs or {}).get(name)))
    ax.plot([0, 1], [0, 1], color="grey", ls=":", lw=1)
    ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="false-positive rate", ylabel="true-positive rate", title=title)
    _legend(ax)
    return to_svg(fig)


def pr_plot(curves: Mapping[str, Mapping[str, Sequence[float]]], title: str = "Precision-recall") -> str:
    """One precision-recall curve per name (``{"recall": [...], "precision": [...]}``)."""
    fig, ax = _figure(_WIDE if len(curves) > _LEGEND_INSIDE_MAX else _SIZE)
    for (name, c), color in zip(curves.items(), _colors(len(curves))):
        ax.plot(c["recall"], c["precision"], color=color, lw=1.4, label=name)
    ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="recall", ylabel="precision", title=title)
    _legend(ax)
    return to_svg(fig)


def reliability_plot(mean_predicted: Sequence[float], fraction_positive: Sequence[float],
                     count: Sequence[int] | None = None, title: str = "Reliability") -> str:
    """Calibration: observed fraction of members per bin against the mean predicted probability,
    with the diagonal (perfect calibration) and, below, how many samples each bin holds."""
    fig = Figure(figsize=(6.0, 4.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (3, 1)})
    top.plot([0, 1], [0, 1], color="grey", ls=":", lw=1, label="perfectly calibrated")
    top.plot(mean_predicted, fraction_positive, marker="o", color="#2f6db5", lw=1.4, label="calibrated model")
    top.set(xlim=(0, 1), ylim=(0, 1.01), ylabel="observed fraction of members", title=title)
    top.legend(fontsize=8, loc="upper left")
    if count is not None:
        bottom.bar(mean_predicted, count, width=0.03, color="#2f6db5", alpha=0.6)
    bottom.set(xlabel="mean predicted probability", ylabel="samples")
    return to_svg(fig)


def histogram_plot(groups: Mapping[str, Sequence[float]], xlabel: str, bins: int = 20,
                   title: str | None = None, colors: Mapping[str, str] | None = None) -> str:
    """Overlaid histograms, one per group (shared bin edges so the groups compare bar for bar)."""
    fig, ax = _figure()
    values = {name: _finite(v) for name, v in groups.items()}
    every = [x for v in values.values() for x in v]
    lo, hi = (min(every), max(every)) if every else (0.0, 1.0)
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)] if hi > lo else bins
    palette = {**VERDICT_COLORS, **(colors or {})}
    for (name, v), color in zip(values.items(), _colors(len(values))):
        if v:
            ax.hist(v, bins=edges, alpha=0.5, color=palette.get(name, color), label=f"{name} (n={len(v)})")
    ax.set(xlabel=xlabel, ylabel="samples", title=title)
    _legend(ax)
    return to_svg(fig)


def line_plot(x: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str,
              logx: bool = False, title: str | None = None) -> str:
    """One line per series over the shared ``x`` (e.g. dose -> AUC); None or NaN leave a gap."""
    fig, ax = _figure(_WIDE if len(series) > _LEGEND_INSIDE_MAX else _SIZE)
    for (name, ys), color in zip(series.items(), _colors(len(series))):
        ax.plot(x, [math.nan if y is None else y for y in ys], marker="o", ms=3, color=color, lw=1.4, label=name)
    if logx and min(x, default=1) <= 0:  # linear below 1, so that a dose sweep's control (0) has a place
        ax.set_xscale("symlog", linthresh=1)
    elif logx:
        ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    _legend(ax)
    return to_svg(fig)


def bar_plot(labels: Sequence[str], values: Sequence[float], ylabel: str,
             intervals: Sequence[Sequence[float] | None] | None = None, title: str | None = None) -> str:
    """Vertical bars, with a [lo, hi] interval per bar when given (None for a bar without one)."""
    fig, ax = _figure()
    heights = [math.nan if v is None else v for v in values]
    ax.bar(range(len(labels)), heights, color=_colors(len(labels)))
    if intervals is not None:
        for i, (h, ci) in enumerate(zip(heights, intervals)):
            if ci is not None and math.isfinite(h):
                ax.errorbar(i, h, yerr=[[h - ci[0]], [ci[1] - h]], color="black", capsize=3, lw=1)
    ax.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0, ha="right"
                  if len(labels) > 4 else "center", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    return to_svg(fig)


_SVG_OPEN = re.compile(r"\s*<svg[\s>]")


def is_svg(text) -> bool:
    """A string that opens with an ``<svg`` element (what the functions above return)."""
    return isinstance(text, str) and bool(_SVG_OPEN.match(text))
