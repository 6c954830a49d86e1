"""Self-contained HTML reports: an audit's (``render_audit``) and a simulated-leak run's
(``render_simulate``).

One file each: inline CSS, a small inline script (sort and filter), plots as inline SVG from
``leakray.report.plots``. Nothing is fetched at view time, and a Content-Security-Policy says
so to the browser: only the report's own script (by its hash) may run and nothing may load.
Every text from the data goes through ``html.escape``: prompts and completions are hostile."""

from __future__ import annotations

import base64
import difflib
import hashlib
import json
import logging
import math
import re
from html import escape
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from leakray.errors import BadInput
from leakray.report import plots
from leakray.report.advprompt_kinds import advprompt_kinds_line
from leakray.report.costs import parts_by_stage, shared_run_note, time_by_stage
from leakray.report.rows import row_lines
from leakray.schema import S

log = logging.getLogger(__name__)

VERDICTS = ("confirmed", "suspected", "clean")
DASH = "–"
MAX_DIFF_CHARS = 20000  # difflib is quadratic at worst; past this the texts are shown without a diff
HISTOGRAM_DETECTORS = 4  # member vs non-member histograms for this many of the best detectors
PR_DETECTORS = 6  # precision-recall curves for this many of the best detectors (more is unreadable)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1280px;
 padding:1rem 1.5rem;color:#1d232b;background:#fbfbfc}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.15rem;margin:1.6rem 0 .6rem;border-bottom:1px solid #dde}
.meta{color:#556;margin:.2rem 0 1rem}.cards{display:flex;flex-wrap:wrap;gap:.8rem}
.card{background:#fff;border:1px solid #dde;border-radius:8px;padding:.7rem 1rem;min-width:200px;flex:1}
.card .k{color:#556;font-size:.85rem}.card .v{font-size:1.6rem;font-weight:600}.card .s{color:#556;font-size:.85rem}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:1rem}
figure{margin:0;background:#fff;border:1px solid #dde;border-radius:8px;padding:.4rem}
figure svg{width:100%;height:auto;display:block}figcaption{color:#556;font-size:.85rem;padding:.2rem .4rem}
table{border-collapse:collapse;width:100%;background:#fff}th,td{border-bottom:1px solid #e4e6ea;padding:.3rem .5rem;
 text-align:left;vertical-align:top}th{background:#f0f2f5;position:sticky;top:0}
table.sortable th{cursor:pointer;user-select:none}th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}th[data-type=num]{text-align:right}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{border-radius:4px;padding:0 .4rem;color:#fff;font-size:.85rem}
.v-confirmed{background:#c0392b}.v-suspected{background:#e67e22}.v-clean{background:#2e8b57}
tr.detail td{border-bottom:2px solid #ccd;padding-top:0}summary{cursor:pointer;color:#2f6db5;font-size:.85rem}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f7f9;border:1px solid #e4e6ea;padding:.5rem;
 max-height:24rem;overflow:auto;margin:.2rem 0 .6rem;font-size:12.5px}
ins{background:#d4f7d4;text-decoration:none}del{background:#fbd5d5}
.controls{display:flex;gap:.6rem;align-items:center;margin:.4rem 0}.controls input{flex:1;max-width:360px}
.note{color:#556;font-size:.85rem}
"""

# Sorts by the clicked header (numbers by value, missing ones last either way); filters the
# samples table by text and verdict. A table's sortable units are its <tbody>s when it has
# several (a sample and its detail row move together), else its rows.
_JS = """
(function () {
  function units(t) { return t.tBodies.length > 1 ? Array.from(t.tBodies) : Array.from(t.tBodies[0].rows); }
  function key(u, i, num) {
    var c = (u.rows ? u.rows[0] : u).cells[i], v = c ? c.getAttribute('data-v') : null;
    if (v === null) v = c ? c.textContent.trim() : '';
    if (v === '' || v === '\\u2013') return null;
    return num ? parseFloat(v) : v.toLowerCase();
  }
  document.querySelectorAll('table.sortable').forEach(function (t) {
    var ths = Array.from(t.tHead.rows[0].cells);
    ths.forEach(function (th, i) {
      th.addEventListener('click', function () {
        var num = th.getAttribute('data-type') === 'num';
        var dir = th.getAttribute('aria-sort') === 'ascending' ? -1 : 1;
        ths.forEach(function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', dir === 1 ? 'ascending' : 'descending');
        var us = units(t), parent = us.length && us[0].parentNode;
        us.sort(function (a, b) {
          var x = key(a, i, num), y = key(b, i, num);
          if (x === null || (num && isNaN(x))) return (y === null || (num && isNaN(y))) ? 0 : 1;
          if (y === null || (num && isNaN(y))) return -1;
          return dir * (num ? x - y : x.localeCompare(y, undefined, {numeric: true}));
        });
        us.forEach(function (u) { parent.appendChild(u); });
      });
    });
  });
  var table = document.getElementById('samples');
  if (!table) return;
  var q = document.getElementById('filter-text'), sel = document.getElementById('filter-verdict');
  var shown = document.getElementById('shown');
  function apply() {
    var text = q.value.trim().toLowerCase(), verdict = sel.value, n = 0;
    Array.from(table.tBodies).forEach(function (b) {
      var ok = (!verdict || b.getAttribute('data-verdict') === verdict) &&
               (!text || b.textContent.toLowerCase().indexOf(text) >= 0);
      b.hidden = !ok; if (ok) n++;
    });
    shown.textContent = n + ' of ' + table.tBodies.length + ' samples shown';
  }
  q.addEventListener('input', apply); sel.addEventListener('change', apply); apply();
})();
"""


def _script_hash(js: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()


# no network and no other script: what a reader's browser may do with this file
_CSP = (f"default-src 'none'; script-src '{_script_hash(_JS)}'; style-src 'unsafe-inline'; "
        "img-src data:; font-src data:")


def page(title: str, body: str) -> str:
    """A whole HTML document around ``body`` (already escaped HTML) with the report's CSS and script."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{escape(_CSP)}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>{escape(title)}</title><style>{_CSS}</style></head>\n'
            f'<body>\n{body}\n<script>{_JS}</script>\n</body></html>\n')


# ---------------------------------------------------------------- formatting


def _num(v) -> float | None:
    """A finite float, or None for missing / NaN."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def fmt(v, digits: int = 3) -> str:
    """A cell's text: numbers rounded, missing / NaN as –, everything escaped."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return f"[{fmt(v[0], digits)}, {fmt(v[1], digits)}]"
    if v is None or v == "":
        return DASH
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    n = _num(v)
    if isinstance(v, (float, np.floating)):
        return DASH if n is None else f"{n:.{digits}f}"
    return escape(str(v))


def pct(v, digits: int = 1) -> str:
    n = _num(v)
    return DASH if n is None else f"{100 * n:.{digits}f}%"


def _interval(ci, f: Callable = fmt) -> str:
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or _num(ci[0]) is None or _num(ci[1]) is None:
        return ""
    return f"95% CI [{f(ci[0])}, {f(ci[1])}]"


def _get(d, *keys):
    """``d[k1][k2]...`` with None wherever a level is missing or None."""
    for k in keys:
        if not isinstance(d, Mapping):
            return None
        d = d.get(k)
    return d


def _cell(v, digits: int = 3) -> str:
    """A numeric table cell: shown rounded, sorted by the raw value (``data-v``)."""
    n = _num(v)
    raw = "" if n is None else repr(n)
    return f'<td class="num" data-v="{raw}">{fmt(v, digits)}</td>'


def _table(headers: Iterable[tuple[str, str]], rows: Iterable[str], cls: str = "sortable", tid: str = "") -> str:
    ths = "".join(f'<th data-type="{kind}" scope="col">{escape(h)}</th>' for h, kind in headers)
    ident = f' id="{tid}"' if tid else ""
    return f'<table class="{cls}"{ident}><thead><tr>{ths}</tr></thead>\n' + "\n".join(rows) + "\n</table>"


def _figure(caption: str, svg: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _safe_plot(caption: str, make: Callable[[], str]) -> str:
    """A plot, or a note where odd data made it fail: a report never dies over one plot."""
    try:
        return _figure(caption, make())
    except Exception as exc:  # noqa: BLE001 - any plotting error only costs this plot
        log.warning("plot %r skipped: %s: %s", caption, type(exc).__name__, exc)
        why = f"{type(exc).__name__}: {exc}"
        return f'<p class="note">Plot “{escape(caption)}” skipped: {escape(why)}</p>'



def _left_out_html(copies) -> str:
    """The control tasks the audit left out as near-copies of benchmark tasks (`load_control`)."""
    if not copies:
        return ""
    if not isinstance(copies, list) or not all(isinstance(c, list) and len(c) >= 2 for c in copies):
        raise BadInput(f"expected [control id, benchmark id, Jaccard] rows, got {copies!r}",
                       field="control.near_copies_left_out")
    return (f"<br>{len(copies)} control task{'' if len(copies) == 1 else 's'} left out as near-copies of benchmark "
            "tasks: " + escape(", ".join(f"{c[0]} ~ {c[1]}" for c in copies)))

def _card(key: str, value: str, sub: str = "") -> str:
    return f'<div class="card"><div class="k">{escape(key)}</div><div class="v">{value}</div>' \
           f'<div class="s">{sub}</div></div>'


# ---------------------------------------------------------------- diff

_TOKENS = re.compile(r"\s+|\w+|[^\w\s]")


def diff_html(reference: str, completion: str) -> str:
    """The completion against the reference, token by token: ``<del>`` what the reference has and the
    completion lacks, ``<ins>`` what the completion adds; everything escaped."""
    if len(reference) + len(completion) > MAX_DIFF_CHARS:
        return escape(completion)
    a, b = _TOKENS.findall(reference), _TOKENS.findall(completion)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        old, new = escape("".join(a[i1:i2])), escape("".join(b[j1:j2]))
        if op == "equal":
            out.append(new)
        else:
            out.append((f"<del>{old}</del>" if old else "") + (f"<ins>{new}</ins>" if new else ""))
    return "".join(out)


# ---------------------------------------------------------------- audit

SAMPLE_COLUMNS = (("task", "text"), ("verdict", "text"), ("q-value", "num"), ("p-value", "num"), ("probability", "num"),
                  ("score", "num"), ("passed", "num"), ("closest similarity", "num"), ("member", "num"))


def _text(sample: dict, field: str, row: int) -> str | None:
    v = sample.get(field)
    if v is None or isinstance(v, str):
        return v
    raise BadInput(f"expected text or null, got {type(v).__name__}", row=row, field=field)


def _check_sample(s, row: int) -> None:
    if not isinstance(s, Mapping):
        raise BadInput(f"a sample must be a mapping, got {type(s).__name__}", row=row)
    verdict = s.get("verdict")
    if verdict is not None and verdict not in VERDICTS:
        raise BadInput(f"verdict {verdict!r} is not one of {', '.join(VERDICTS)}", row=row, field="verdict")
    for field in ("q_value", "p_value", "probability", "score", "passed", "closest_similarity", "member"):
        v = s.get(field)
        if v is not None and _num(v) is None and not (isinstance(v, float) and math.isnan(v)):
            raise BadInput(f"expected a number or null, got {v!r}", row=row, field=field)
    copies = s.get("near_copies")
    if copies is not None and (not isinstance(copies, (list, tuple)) or not all(isinstance(c, str) for c in copies)):
        raise BadInput(f"expected a list of task ids, got {copies!r}", row=row, field="near_copies")


def _sample_body(s: Mapping, row: int) -> str:
    verdict = s.get("verdict")
    badge = f'<span class="verdict v-{verdict}">{verdict}</span>' if verdict else DASH
    main = (f'<tr class="sample"><td data-v="{escape(str(s.get("task_id") or ""))}">{fmt(s.get("task_id"))}</td>'
            f'<td data-v="{verdict or ""}">{badge}</td>' + _cell(s.get("q_value")) + _cell(s.get("p_value"))
            + _cell(s.get("probability")) + _cell(s.get("score"))
            + _cell(s.get("passed"), 2) + _cell(s.get("closest_similarity")) + _cell(s.get("member"), 0) + "</tr>")
    ref, closest = _text(s, "reference", row), _text(s, "closest", row)
    prompt, evidence = _text(s, "prompt", row), _text(s, "evidence", row)
    if closest is None:
        closest_html = '<p class="note">no completion recorded</p>'
    else:
        closest_html = f"<pre>{diff_html(ref or '', closest)}</pre>"
    detail = (f'<tr class="detail"><td colspan="{len(SAMPLE_COLUMNS)}"><details><summary>prompt · reference · '
              f'closest completion · evidence</summary>'
              f'<h4>Prompt</h4><pre>{escape(prompt) if prompt is not None else DASH}</pre>'
              f'<h4>Reference</h4><pre>{escape(ref) if ref is not None else DASH}</pre>'
              f'<h4>Closest completion <span class="note">(similarity {fmt(s.get("closest_similarity"))}; '
              f'<del>removed from</del> / <ins>added to</ins> the reference)</span></h4>{closest_html}'
              f'<h4>Evidence</h4><pre>{escape(evidence) if evidence else DASH}</pre>'
              + (f'<h4>Near-copies inside the benchmark</h4><p>{escape(", ".join(s["near_copies"]))}</p>'
                 if s.get("near_copies") else "") + '</details></td></tr>')
    return f'<tbody data-verdict="{verdict or ""}">{main}{detail}</tbody>'


def _summary_cards(summary: Mapping) -> str:
    lf, infl = summary.get("leaked_fraction") or {}, summary.get("inflation") or {}
    sc, cr = summary.get("self_calibrated") or {}, summary.get("card_route") or {}
    verdicts = summary.get("verdicts") or {}
    ratio = _num(infl.get("ratio"))
    null = infl.get("null") or {}
    if _num(lf.get("estimate")) is None:
        headline = _card("estimated leaked fraction", "not estimated", escape(str(lf.get("statement") or DASH)))
    else:
        headline = _card("estimated leaked fraction", pct(lf.get("estimate")),
                         " · ".join(x for x in (_interval(lf.get("ci"), pct), f"route: {fmt(lf.get('route'))}") if x)
                         + (f" · truth {pct(lf.get('truth'))}" if _num(lf.get("truth")) is not None else "")
                         + (f" · confirmed share {pct(lf.get('confirmed_share'))}"
                            if _num(lf.get("confirmed_share")) is not None else "")
                         + (f"<br>{escape(lf['caveat'])}" if lf.get("caveat") else ""))
    ctl = summary.get("control")
    valid = bool(ctl) and ctl.get("detected") is not None  # its null held: its numbers mean something
    control = [_card("control route (measured null)", pct(ctl.get("estimate")) if valid else DASH,
                     " · ".join(x for x in (_interval(ctl.get("ci"), pct) if valid else "",
                                            f"{fmt(ctl.get('n_control'))} control tasks") if x)
                     + (f"<br>benchmark &gt; control: Mann–Whitney p {fmt((ctl.get('test') or {}).get('p'))}; at least "
                        f"{pct(ctl.get('lower_bound'))} (one-sided 95%)" if valid else "")
                     + ("" if ctl.get("usable") else f"<br>{escape(str(ctl.get('why_unusable')))}")
                     + _left_out_html(ctl.get("near_copies_left_out")))] if ctl else []
    routes = _card("the two routes", f"{pct(sc.get('estimate'))} / {pct(cr.get('estimate'))}",
                   f"self-calibrated (reference model {escape(str(summary.get('reference_model')))}) / card ("
                   + ("transfers" if (cr.get("transfer") or {}).get("ok") else "does not transfer") + ")"
                   + "".join(f"<br>{escape(r)}: {escape(str(x.get('why_unusable')))}"
                             for r, x in (("self-calibrated", sc), ("card", cr)) if x and not x.get("usable")))
    cards = [
        headline, *control, routes,
        _card("score inflation (flagged / clean pass@1)", DASH if ratio is None else f"{ratio:.2f}×",
              " ".join(x for x in (_interval(infl.get("ratio_ci"), lambda v: f"{v:.2f}×"),) if x)
              + f"<br>pass@1 flagged {fmt(infl.get('pass1_flagged'))} (n={fmt(infl.get('n_flagged'))}) · "
                f"clean {fmt(infl.get('pass1_clean'))} (n={fmt(infl.get('n_clean'))})"
              + (f"<br>a leak-free model's difference {fmt(null.get('difference'))}; excess "
                 f"{fmt(null.get('excess_difference'))}" if null.get("difference") is not None else "")),
        _card("benchmark score on clean samples", fmt(infl.get("score_clean")),
              f"all samples {fmt(infl.get('score_all'))}"),
        _card("verdicts", " / ".join(fmt(verdicts.get(v)) for v in VERDICTS), "confirmed / suspected / clean<br>"
              + escape(str(summary.get("suspected_means") or ""))),
    ]
    if summary.get("access"):  # what the target gave, hence which of the card's detectors could run
        chat = summary.get("chat_api")
        answers = (chat or {}).get("answers") or {}
        cards.append(_card("access", escape(str(summary["access"])),
                           f"detectors run: {escape(', '.join(summary.get('detectors_run') or []) or 'none')}"
                           + (f"<br>through a chat API ({fmt(chat.get('rows'))} rows; answers fenced "
                              f"{fmt(answers.get('chat_answer_fenced'))}, opened with a sentence "
                              f"{fmt(answers.get('chat_answer_prose_before_code'))}, repeating the given code "
                              f"{fmt(answers.get('chat_answer_repeated_the_code'))})" if chat else "")))
    return '<div class="cards">' + "".join(cards) + "</div>"


AUDIT_DETECTOR_COLUMNS = (("detector", "text"), ("family", "text"), ("access", "text"), ("AUC", "num"),
                          ("AUC 95% CI", "text"), ("TPR@1%FPR", "num"), ("TPR@5%FPR", "num"), ("Brier", "num"),
                          ("AUC on the target (planted truth)", "num"))


def _detector_rows(detectors: Mapping) -> list[str]:
    rows = []
    for name, d in detectors.items():
        d = d or {}
        rows.append(f'<tr><td>{fmt(name)}</td><td>{fmt(d.get("family"))}</td><td>{fmt(d.get("access"))}</td>'
                    + _cell(d.get("auc")) + f'<td>{fmt(d.get("auc_ci"))}</td>' + _cell(d.get("tpr_at_1fpr"))
                    + _cell(d.get("tpr_at_5fpr")) + _cell(d.get("brier")) + _cell(d.get("target_auc")) + "</tr>")
    return rows


def _skipped(report: Mapping) -> str:
    """Detectors not run, and AdvPrompt-MIA's kinds when fewer than the paper's."""
    items = "".join(f"<li><b>{fmt(n)}</b>: {fmt(why)}</li>" for n, why in (report.get("skipped") or {}).items())
    kinds = advprompt_kinds_line(report.get("config"), report.get("detectors") or {})
    return ((f"<ul class='note'>{items}</ul>" if items else "")
            + "".join(f"<p class='note'>{escape(line.replace('`', ''))}</p>" for line in kinds if line))


def _audit_plots(report: Mapping, samples: list) -> str:
    curves, detectors = report.get("curves") or {}, report.get("detectors") or {}
    aucs = {n: _get(detectors, n, "auc") for n in curves}
    rel, cal = _get(report, "calibration", "reliability") or {}, report.get("calibration") or {}
    figs = []
    roc = {n: c["roc"] for n, c in curves.items() if (c or {}).get("roc")}
    pr = {n: c["pr"] for n, c in curves.items() if (c or {}).get("pr")}
    if roc:
        figs.append(_safe_plot("ROC per detector on held-out shadow data",
                               lambda: plots.roc_plot(roc, aucs, "ROC (shadow validation)")))
    if pr:
        figs.append(_safe_plot("Precision-recall per detector on held-out shadow data",
                               lambda: plots.pr_plot(pr, "Precision-recall (shadow validation)")))
    if rel.get("mean_predicted"):
        figs.append(_safe_plot(
            f"Reliability of the calibrated probability ({cal.get('method') or DASH}); Brier "
            f"{fmt(cal.get('brier'))}, uncalibrated {fmt(cal.get('brier_uncalibrated'))}",
            lambda: plots.reliability_plot(rel["mean_predicted"], rel.get("fraction_positive") or [],
                                           rel.get("count"), "Reliability (held-out shadow data)")))
    by_verdict = {v: [s.get("probability") for s in samples if s.get("verdict") == v] for v in VERDICTS}
    if any(by_verdict.values()):
        figs.append(_safe_plot("Membership probability on the target, by verdict",
                               lambda: plots.histogram_plot(by_verdict, "membership probability",
                                                            title="Probability by verdict")))
    for title, svg in (report.get("extra_plots") or {}).items():
        figs.append(_figure(str(title), svg) if plots.is_svg(svg)
                    else f'<p class="note">Plot “{escape(str(title))}” is not an SVG; not shown.</p>')
    return '<div class="plots">' + "".join(figs) + "</div>" if figs else '<p class="note">No plots.</p>'


def render_audit(report: Mapping, samples: list[Mapping]) -> str:
    """The audit's report.html (see the module doc); missing keys show as –, bad samples are refused."""
    if not isinstance(samples, list):
        raise BadInput(f"samples must be a list, got {type(samples).__name__}", field="samples")
    for i, s in enumerate(samples):
        _check_sample(s, i)
    summary = report.get("summary") or {}
    title = report.get("title") or f"leakray audit — {summary.get('benchmark') or DASH}"
    meta = (f"benchmark <b>{fmt(summary.get('benchmark'))}</b> ({fmt(summary.get('n_tasks'))} tasks) · target "
            f"<b>{fmt(summary.get('target'))}</b> · detector card {fmt(summary.get('card'))} · primary detector "
            f"<b>{fmt(summary.get('primary_detector'))}</b>")
    options = "".join(f'<option value="{v}">{v}</option>' for v in VERDICTS)
    body = [
        f"<h1>{escape(title)}</h1><p class='meta'>{meta}</p>",
        "<h2>Summary</h2>", _summary_cards(summary),
        "<h2>Plots</h2>", _audit_plots(report, samples),
        "<h2>Detectors (validation on shadow data)</h2>",
        _table(AUDIT_DETECTOR_COLUMNS, _detector_rows(report.get("detectors") or {}), tid="detectors"),
        _skipped(report),
        # rows failed, degraded, tried again or read back after a kill: what the per-sample table cannot show
        *(f'<p class="note">{escape(line.replace("`", ""))}</p>' for line in row_lines(report.get("stages") or {})
          if line),
        "<h2>Samples</h2>",
        '<div class="controls"><input id="filter-text" type="search" placeholder="filter: task, text, evidence…" '
        f'aria-label="filter samples"><select id="filter-verdict" aria-label="verdict"><option value="">all verdicts'
        f'</option>{options}</select><span id="shown" class="note"></span></div>',
        _table(SAMPLE_COLUMNS, [_sample_body(s, i) for i, s in enumerate(samples)], tid="samples"),
        '<p class="note">Click a header to sort; click a row’s details to see the texts.</p>',
        *(f'<p class="note">{escape(line)}</p>' for line in time_by_stage(report.get("stages") or {},
                                                                          report.get("timings_s") or {}) if line),
        *(f'<p class="note">{escape(line)}</p>' for line in parts_by_stage(report.get("stages") or {}) if line),
    ]
    return page(title, "\n".join(body))


def write_audit_html(path, report: Mapping, samples: list[Mapping]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_audit(report, samples), encoding="utf-8")
    return path


# ---------------------------------------------------------------- simulated-leak run

SIM_COLUMNS = (("detector", "text"), ("AUC", "num"), ("AUC 95% CI", "text"), ("TPR@1%FPR", "num"),
               ("TPR@5%FPR", "num"), ("MCC", "num"), ("family", "text"), ("access", "text"), ("wall s", "num"))


def _score_rows(scores) -> list[dict]:
    """Scores as row dicts, from a pyarrow Table, a pandas DataFrame or a list of dicts."""
    if hasattr(scores, "to_pylist"):
        return scores.to_pylist()
    if hasattr(scores, "to_dict"):
        return scores.to_dict("records")
    return list(scores)


def first_seed_scores(scores) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per detector, (member labels, scores) of its first seed; rows with an unknown label or a
    non-finite score left out."""
    by_det: dict[str, dict] = {}
    for r in _score_rows(scores):
        by_det.setdefault(r[S.DETECTOR], {}).setdefault(r[S.SEED], []).append(r)
    out = {}
    for name, seeds in by_det.items():
        rows = [r for r in seeds[min(seeds)] if r[S.MEMBER] in (0, 1) and _num(r[S.SCORE]) is not None]
        out[name] = (np.array([r[S.MEMBER] for r in rows], int), np.array([r[S.SCORE] for r in rows], float))
    return out


def _roc_curves(per_det: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> tuple[dict, dict]:
    from sklearn.metrics import roc_auc_score, roc_curve

    curves, aucs = {}, {}
    for name, (y, s) in per_det.items():
        if len(set(y.tolist())) == 2:  # a curve needs both classes
            fpr, tpr, _ = roc_curve(y, s)
            curves[name], aucs[name] = {"fpr": fpr.tolist(), "tpr": tpr.tolist()}, float(roc_auc_score(y, s))
    return curves, aucs


def _pr_curves(per_det: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    from sklearn.metrics import precision_recall_curve

    out = {}
    for name, (y, s) in per_det.items():
        prec, rec, _ = precision_recall_curve(y, s)
        out[name] = {"recall": rec.tolist(), "precision": prec.tolist()}
    return out


def detected_at(m: Mapping, em: str = "") -> str:
    """A dose-sweep detector's "detected at" cell, marked when its dose-0 control clears 0.5
    (``em`` wraps the mark: "*" for markdown)."""
    at = str(m.get("smallest_dose_detected") or "not detected")
    return f"{at} ({em}reads the folds{em}: above 0.5 at dose 0)" if m.get("control_clears") else at


def render_detectability(curve: Mapping) -> str:
    """The dose-sweep's page: AUC and TPR@5%FPR by dose per detector, and the table."""
    doses = list(curve["doses"])
    dets = sorted(curve["detectors"].items(), key=lambda kv: -(_num(kv[1]["auc"][-1]) or 0.0))
    rows = [f"<tr><td>{fmt(n)}</td><td>{fmt(m.get('family'))}</td>" + "".join(_cell(a) for a in m["auc"])
            + f"<td>{fmt(detected_at(m))}</td></tr>" for n, m in dets]
    headers = [("detector", "text"), ("family", "text"), *((f"AUC d={d}", "num") for d in doses),
               ("detected at dose", "text")]
    figs = [_safe_plot(f"{label} by dose (copies of each member in the pretraining mixture)",
                       lambda metric=metric, label=label: plots.line_plot(
                           doses, {n: m[metric] for n, m in dets[:PR_DETECTORS * 2]}, "dose", label, logx=True))
            for metric, label in (("auc", "AUC on the target"), ("tpr_at_5fpr", "TPR at 5% FPR"))]
    title = "leakray detectability curve (pretrain-mix leak)"
    body = [f"<h1>{escape(title)}</h1>",
            "<p class='note'>Detected at: the smallest dose whose AUC 95% interval lies above 0.5.</p>",
            _table(headers, rows, tid="detectability"), '<div class="plots">' + "".join(figs) + "</div>"]
    return page(title, "\n".join(body))


def _by_auc(item) -> tuple:
    auc = _num((item[1] or {}).get("auc"))
    return (auc is None, -(auc or 0.0), item[0])


def _wall_cell(cost: Mapping) -> str:
    """A detector's wall seconds, sorted by that number; a run shared by several detectors (the
    classic models' Tune search, CGMIA with its ensemble) says so, with the detector's own trials'
    seconds where recorded: the shared run's wall time is mostly waiting for a CPU."""
    wall, note = cost.get("wall_s"), shared_run_note(cost, lambda v: fmt(v, 1))
    if not note:
        return _cell(wall, 1)
    n = _num(wall)
    return (f'<td class="num" data-v="{"" if n is None else repr(n)}">{fmt(wall, 1)}'
            f'<span class="note"> ({escape(note)})</span></td>')


def render_simulate(report: Mapping, scores) -> str:
    """The simulated-leak run's report.html: detector table, target ROC per detector (first seed),
    member vs non-member score histograms of the best detectors."""
    detectors = dict(sorted((report.get("detectors") or {}).items(), key=_by_auc))
    rows = [f'<tr><td>{fmt(n)}</td>' + _cell(d.get("auc")) + f'<td>{fmt(d.get("auc_ci"))}</td>'
            + _cell(d.get("tpr_at_1fpr")) + _cell(d.get("tpr_at_5fpr")) + _cell(d.get("mcc"))
            + f'<td>{fmt(d.get("family"))}</td><td>{fmt(d.get("access"))}</td>' + _wall_cell(d.get("cost") or {})
            + "</tr>" for n, d in detectors.items()]
    per_det = first_seed_scores(scores)
    curves, aucs = _roc_curves(per_det)
    order = [n for n in detectors if n in curves] + sorted(set(curves) - set(detectors))
    figs = [_safe_plot("ROC on the target, each detector's first seed (AUC of that seed)",
                       lambda: plots.roc_plot({n: curves[n] for n in order}, aucs, "ROC on the target")),
            _safe_plot("Precision-recall on the target (at the run's member share), first seed",
                       lambda: plots.pr_plot(_pr_curves({n: per_det[n] for n in order[:PR_DETECTORS]}),
                                             "Precision-recall on the target"))] if curves else []
    for name in order[:HISTOGRAM_DETECTORS]:
        y, s = per_det[name]
        figs.append(_safe_plot(f"{name}: target scores, members vs non-members (first seed)",
                               lambda y=y, s=s, name=name: plots.histogram_plot(
                                   {"member": s[y == 1].tolist(), "non-member": s[y == 0].tolist()},
                                   "score (higher = more likely a member)", title=name)))
    bench = _get(report, "benchmark", "name")
    title = f"leakray simulated-leakage run — {bench or DASH}"
    body = [
        f"<h1>{escape(title)}</h1><p class='meta'>run {fmt(report.get('run'))} · {fmt(report.get('protocol'))}</p>",
        "<h2>Detectors on the target (median over seeds)</h2>", _table(SIM_COLUMNS, rows, tid="detectors"),
        _skipped(report),
        # what happened to the rows (failed or degraded, tried again, read back after a kill), as report.md says
        *(f'<p class="note">{escape(line.replace("`", ""))}</p>' for line in row_lines(report.get("stages") or {})
          if line),
        '<p class="note">Every number, per seed: report.json; the same in short: report.md.</p>',
        "<h2>Plots</h2>",
        '<div class="plots">' + "".join(figs) + "</div>" if figs else "<p class='note'>No scores.</p>",
        # where the run's time went, stage by stage and inside each (report.md's stage table in short)
        *(f'<p class="note">{escape(line)}</p>' for line in time_by_stage(report.get("stages") or {},
                                                                          report.get("timings_s") or {}) if line),
        *(f'<p class="note">{escape(line)}</p>' for line in parts_by_stage(report.get("stages") or {}) if line),
    ]
    return page(title, "\n".join(body))


def write_simulate_html(run_dir) -> Path:
    """``<run>/report.html`` from ``<run>/report.json`` and ``<run>/detect/scores.parquet``."""
    import pyarrow.parquet as pq

    run_dir = Path(run_dir)
    report = json.loads((run_dir / "report.json").read_text())
    scores_path = run_dir / "detect" / "scores.parquet"
    scores = pq.read_table(scores_path, columns=[S.DETECTOR, S.SEED, S.SCORE, S.MEMBER]) if scores_path.exists() else []
    out = run_dir / "report.html"
    out.write_text(render_simulate(report, scores), encoding="utf-8")
    return out
