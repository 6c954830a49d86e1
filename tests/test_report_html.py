"""The self-contained HTML reports: escaping, missing keys, diff marks, and a real browser
(headless Chromium through selenium) that renders, sorts and filters them."""

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from leakray.errors import BadInput
from leakray.report import html as rh
from leakray.report import plots
from leakray.schema import S

HOSTILE = '</pre></td></tr></table><script>window.__pwned = 1;</script><img src=x onerror="window.__pwned=2">'
VERDICT_OF = ("confirmed", "suspected", "clean", "clean", "clean")


def _samples(n=30, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in rng.permutation(n):  # shuffled, so the table does not start sorted by probability
        verdict = VERDICT_OF[i % len(VERDICT_OF)]
        out.append({"task_id": f"task-{i:02d}", "prompt": f"def f{i}(a, b):\n    '''{HOSTILE}'''\n",
                    "reference": f"    return a + b * {i}\n", "closest": f"    return a - b * {i}\n",
                    "closest_similarity": float(rng.uniform()), "probability": float(rng.uniform()),
                    "score": float(rng.normal()), "verdict": verdict,
                    "passed": None if i == 3 else float(i % 2), "evidence": f"jaccard 0.{i} {HOSTILE}",
                    "member": int(verdict != "clean")})
    return out


def _report():
    curves = {name: {"roc": {"fpr": [0, 0.1, 0.4, 1], "tpr": [0, 0.5 + k, 0.8, 1]},
                     "pr": {"recall": [0, 0.5, 1], "precision": [1, 0.8 - k, 0.5]}}
              for name, k in (("cgmia", 0.2), ("min_k", 0.0))}
    return {"title": f"audit {HOSTILE}",
            "summary": {"benchmark": "humaneval", "n_tasks": 30, "target": "tiny-leaky", "card": None,
                        "primary_detector": "cgmia",
                        "prevalence": {"estimate": 0.21, "ci": [0.12, 0.3], "method": "adjusted classify-and-count",
                                       "classify_and_count": 0.25, "em": 0.2, "truth": 0.2},
                        "inflation": {"pass1_flagged": 0.8, "pass1_clean": 0.3, "ratio": 2.67, "ratio_ci": [1.5, 4.0],
                                      "n_flagged": 12, "n_clean": 18, "score_all": 0.5, "score_clean": 0.3},
                        "verdicts": {"confirmed": 6, "suspected": 6, "clean": 18},
                        "threshold": {"fpr": 0.05, "score": 1.2, "probability": 0.7}},
            "detectors": {"cgmia": {"auc": 0.93, "auc_ci": [0.88, 0.97], "tpr_at_5fpr": 0.6, "family": "learned",
                                    "access": "logprobs"},
                          "min_k": {"auc": 0.8, "auc_ci": [0.7, 0.9], "tpr_at_5fpr": 0.3, "family": "likelihood",
                                    "access": "logprobs"}},
            "curves": curves,
            "calibration": {"method": "isotonic", "brier": 0.12, "brier_uncalibrated": 0.2,
                            "reliability": {"mean_predicted": [0.1, 0.3, 0.5, 0.7, 0.9],
                                            "fraction_positive": [0.05, 0.3, 0.55, 0.7, 0.95],
                                            "count": [10, 5, 4, 5, 6]}},
            "extra_plots": {"dose": plots.line_plot([0, 1, 3], {"cgmia": [0.5, 0.8, 0.95]}, "dose", "AUC"),
                            "not svg": HOSTILE}}


def test_hostile_text_is_escaped_everywhere():
    page = rh.render_audit(_report(), _samples(5))
    assert len(re.findall(r"<script", page)) == 1  # the report's own script only
    assert "<img" not in page and "&lt;script&gt;window.__pwned" in page
    assert "Plot “not svg” is not an SVG; not shown." in page


def test_missing_keys_render_a_dash():
    page = rh.render_audit({}, [{"task_id": "t1"}, {"task_id": "t2", "verdict": None, "probability": float("nan")}])
    assert page.count('data-verdict=""') == 2 and "No plots." in page
    assert 'data-v=""' in page and f">{rh.DASH}<" in page
    assert rh.render_audit({"summary": {"prevalence": None, "inflation": {"ratio_ci": None}}}, [])


def test_bad_sample_refused_with_row_and_field():
    with pytest.raises(BadInput, match=r"row 1, field 'verdict'"):
        rh.render_audit({}, [{"verdict": "clean"}, {"verdict": "leaked"}])
    with pytest.raises(BadInput, match=r"row 0, field 'probability'"):
        rh.render_audit({}, [{"probability": "high"}])
    with pytest.raises(BadInput, match=r"row 0, field 'near_copies'"):
        rh.render_audit({}, [{"near_copies": "HumanEval/61"}])
    with pytest.raises(BadInput, match=r"row 0, field 'near_copies'"):
        rh.render_audit({}, [{"near_copies": 61}])


def test_a_samples_near_copies_are_in_its_details():
    page = rh.render_audit({}, [{"task_id": "HumanEval/56", "near_copies": ["HumanEval/61", HOSTILE]},
                                {"task_id": "HumanEval/0", "near_copies": []}])
    assert page.count("Near-copies inside the benchmark") == 1 and "HumanEval/61, &lt;/pre&gt;" in page


def test_diff_marks_the_changed_token_only():
    out = rh.diff_html("    return a + b\n", "    return a - b\n")
    assert out == "    return a <del>+</del><ins>-</ins> b\n"
    assert rh.diff_html("x = '<'", "x = '<'") == "x = &#x27;&lt;&#x27;"


def test_a_failing_plot_costs_only_that_plot(monkeypatch, caplog):
    def broken(*a, **k):
        raise ValueError("odd data")

    monkeypatch.setattr(plots, "histogram_plot", broken)
    with caplog.at_level(logging.WARNING, logger="leakray.report.html"):
        page = rh.render_audit(_report(), _samples(5))
    assert "skipped: ValueError: odd data" in page and "odd data" in caplog.text
    assert page.count("<svg") == 4  # ROC, PR, reliability, the extra line plot


def _data_line(svg: str) -> str:
    """The path of the first series line (drawn 1.4 wide; axes, grid and ticks are not)."""
    return re.search(r'<path d="([^"]*)"[^>]*stroke-width: 1\.4', svg).group(1)


def test_plots_are_svg_and_take_gaps():
    svgs = [plots.histogram_plot({"clean": [0.2, 0.2], "confirmed": []}, "p"),
            plots.reliability_plot([0.2, 0.8], [0.1, 0.9], [3, 4])]
    assert all(plots.is_svg(s) and "<?xml" not in s for s in svgs)
    # a missing point breaks the line in two (a NaN drawn as a value would join it, or crash)
    x = [1, 2, 3, 4, 5]
    whole = _data_line(plots.line_plot(x, {"a": [0.1, 0.2, 0.3, 0.4, 0.5]}, "dose", "AUC", logx=True))
    gapped = _data_line(plots.line_plot(x, {"a": [0.1, 0.2, None, 0.4, float("nan")]}, "dose", "AUC", logx=True))
    assert (whole.count("M"), whole.count("L")) == (1, 4)
    assert (gapped.count("M"), gapped.count("L")) == (2, 1)  # 0.1-0.2, then 0.4 alone
    # a missing bar is an empty patch without an interval; the others are drawn
    full = plots.bar_plot(["a", "b"], [0.5, 0.7], "AUC", intervals=[[0.4, 0.6], [0.6, 0.8]])
    gap = plots.bar_plot(["a", "b"], [0.5, None], "AUC", intervals=[[0.4, 0.6], None])
    assert [plots.is_svg(s) for s in (full, gap)] == [True, True]
    assert len(re.findall(r'<path d="M 0 0 \s*z', gap)) == 1 and len(re.findall(r'<path d="M 0 0 \s*z', full)) == 0
    assert full.count('id="LineCollection_') == 2 and gap.count('id="LineCollection_') == 1
    # the same gaps in a page's table: a dash, and an empty sort key, never "None" or "nan"
    page = rh.render_detectability({"doses": [1, 10, 100], "detectors": {
        "a": {"family": "likelihood", "auc": [0.5, None, 0.9], "tpr_at_5fpr": [0.1, None, 0.6],
              "smallest_dose_detected": 100},
        "b": {"family": "learned", "auc": [float("nan"), None, None], "tpr_at_5fpr": [None] * 3,
              "smallest_dose_detected": None}}})
    rows = dict(re.findall(r"<tr><td>(\w+)</td>(.*?)</tr>", page))
    dash = f'<td class="num" data-v="">{rh.DASH}</td>'
    assert rows["a"].count(dash) == 1 and ">0.500<" in rows["a"] and ">0.900<" in rows["a"]
    assert rows["b"].count(dash) == 3 and "not detected" in rows["b"]
    assert "None" not in page and ">nan<" not in page.lower() and page.count("<svg") == 2


def _sim_run(tmp_path: Path) -> Path:
    """A tiny run dir: report.json with three detectors, scores of two (two seeds each)."""
    run = tmp_path / "humaneval-tiny"
    (run / "detect").mkdir(parents=True)
    rng = np.random.default_rng(1)
    rows = []
    for det, gap in (("cgmia", 2.0), ("zlib", 0.5)):
        for seed in (0, 1):
            for i in range(20):
                member = i % 2
                rows.append({S.TASK_ID: f"T/{i}", S.DETECTOR: det, S.SEED: seed, S.SCORE: rng.normal() + gap * member,
                             S.PREDICTION: member, S.MEMBER: member})
    pq.write_table(pa.Table.from_pylist(rows), run / "detect" / "scores.parquet")
    report = {"run": run.name, "benchmark": {"name": "humaneval"}, "protocol": f"p {HOSTILE}",
              "detectors": {"zlib": {"auc": 0.7, "auc_ci": [0.5, 0.85], "tpr_at_1fpr": 0.1, "tpr_at_5fpr": 0.2,
                                     "mcc": 0.3, "family": "likelihood", "access": "logprobs", "cost": {"wall_s": 0.1}},
                            "cgmia": {"auc": 0.95, "auc_ci": [0.9, 1.0], "tpr_at_1fpr": 0.5, "tpr_at_5fpr": 0.8,
                                      "mcc": 0.8, "family": "learned", "access": "logprobs", "cost": None},
                            "advprompt": {"auc": float("nan")}},
              "skipped": {"codemi": "needs a reference model"}}
    (run / "report.json").write_text(json.dumps(report))
    return run


def test_simulate_report_orders_by_auc_and_plots_first_seed(tmp_path):
    out = rh.write_simulate_html(_sim_run(tmp_path))
    page = out.read_text()
    names = re.findall(r"<tr><td>(\w+)</td>", page)
    assert names == ["cgmia", "zlib", "advprompt"]  # by AUC, NaN last
    assert page.count("<svg") == 4 and "needs a reference model" in page and "<img" not in page  # ROC, PR, 2 hist.
    assert "Inside the stages" not in page  # a report without stage stats: no line


def test_simulate_report_says_where_each_stages_time_went(tmp_path):
    run = _sim_run(tmp_path)
    report = json.loads((run / "report.json").read_text())
    report["stages"] = {"detect": {"seconds": 103.3, "machine_busy": 0.96,
                                   "part_seconds": {"fit": 105.7, "advprompt_ablation": 48.5, "metrics": 3.5},
                                   "throughput": {"detector_seeds_per_s": 0.8}},
                        "folds": {"seconds": 0.0}}
    (run / "report.json").write_text(json.dumps(report))
    page = rh.write_simulate_html(run).read_text()
    assert "Time by stage (wall, in the invocation that ran it; the machine&#x27;s CPUs busy over it): detect " \
           "103.3 s (96%)." in page
    assert "detect: fit 105.7 s, advprompt_ablation 48.5 s, metrics 3.5 s (0.8 detector seeds/s)." in page


# ---------------------------------------------------------------- real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no chromium/chromedriver on PATH (.ci/run installs Debian's chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _open(driver, path: Path):
    driver.get(path.resolve().as_uri())
    driver.get_log("browser")  # drop entries from an earlier page


def _no_console_errors(driver):
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def _probabilities(driver) -> list[float]:
    return driver.execute_script(  # the column found by its header, not by position
        "const i = Array.from(document.querySelectorAll('#samples th')).findIndex("
        "th => th.textContent.trim() === 'probability');"
        "return Array.from(document.querySelectorAll('#samples tbody')).map("
        "b => parseFloat(b.rows[0].cells[i].getAttribute('data-v')));")


def test_audit_report_renders_sorts_and_filters_in_chromium(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    samples = _samples(30)
    _open(browser, rh.write_audit_html(tmp_path / "report.html", _report(), samples))

    svgs = browser.find_elements(By.CSS_SELECTOR, "figure svg")
    assert len(svgs) == 5 and all(s.size["width"] > 100 and s.size["height"] > 100 for s in svgs)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#samples tbody")) == 30
    assert browser.execute_script("return window.__pwned === undefined")

    before = _probabilities(browser)
    header = browser.find_element(By.XPATH, "//table[@id='samples']//th[normalize-space()='probability']")
    header.click()
    ascending = _probabilities(browser)
    assert ascending == sorted(before) and ascending != before
    header.click()
    assert _probabilities(browser) == sorted(before, reverse=True)

    # a sample's detail row travels with it and shows the diff when opened
    first = browser.find_element(By.CSS_SELECTOR, "#samples tbody")
    first.find_element(By.TAG_NAME, "summary").click()
    assert first.find_element(By.CSS_SELECTOR, "pre del").text == "+"
    assert first.find_element(By.CSS_SELECTOR, "pre ins").is_displayed()

    visible = "return Array.from(document.querySelectorAll('#samples tbody')).filter(b => !b.hidden).length"
    browser.find_element(By.ID, "filter-text").send_keys("task-07")
    assert browser.execute_script(visible) == 1
    browser.find_element(By.ID, "filter-text").clear()
    browser.execute_script("document.getElementById('filter-text').dispatchEvent(new Event('input'))")
    Select(browser.find_element(By.ID, "filter-verdict")).select_by_value("confirmed")
    assert browser.execute_script(visible) == sum(s["verdict"] == "confirmed" for s in samples)
    assert browser.find_element(By.ID, "shown").text == "6 of 30 samples shown"
    _no_console_errors(browser)


def test_simulate_report_renders_in_chromium(browser, tmp_path):
    from selenium.webdriver.common.by import By

    _open(browser, rh.write_simulate_html(_sim_run(tmp_path)))
    svgs = browser.find_elements(By.CSS_SELECTOR, "figure svg")
    assert len(svgs) == 4 and all(s.size["width"] > 100 for s in svgs)
    browser.find_element(By.XPATH, "//th[normalize-space()='wall s']").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "#detectors tbody tr")
    names = [r.find_element(By.TAG_NAME, "td").text for r in rows]
    assert names == ["zlib", "cgmia", "advprompt"]  # by wall time; missing ones last
    _no_console_errors(browser)


def test_the_control_route_card_shows_numbers_only_where_its_null_held():
    held = {"estimate": 0.229, "ci": [0.046, 0.431], "n_control": 55, "lower_bound": 0.083, "detected": True,
            "test": {"p": 0.0073}, "usable": False, "why_unusable": f"interval too wide {HOSTILE}"}
    page = rh.render_audit({"summary": {"control": held}}, [])
    assert "control route (measured null)" in page and "22.9%" in page and "at least 8.3%" in page
    assert "Mann–Whitney p 0.007" in page and "&lt;script&gt;window.__pwned" in page
    broken = {**held, "detected": None, "why_unusable": "the control tasks are not the benchmark's kind"}
    page = rh.render_audit({"summary": {"control": broken}}, [])
    assert "22.9%" not in page and "Mann–Whitney" not in page and "not the benchmark&#x27;s kind" in page
    # control tasks left out as near-copies of benchmark tasks (load_control): named, escaped; a malformed list refused
    page = rh.render_audit({"summary": {"control": {**held, "near_copies_left_out": [["Fresh/1", HOSTILE, 0.8]]}}}, [])
    assert "1 control task left out as near-copies of benchmark tasks: Fresh/1 ~ &lt;/pre&gt;" in page
    assert "<script>window.__pwned" not in page
    with pytest.raises(BadInput, match="control.near_copies_left_out"):
        rh.render_audit({"summary": {"control": {**held, "near_copies_left_out": "Fresh/1"}}}, [])


def test_a_run_of_fewer_advprompt_kinds_says_so_in_the_page():
    detectors = {"advprompt": {"family": "advprompt", "auc": 0.8}}
    every = {"advprompt": True, "advprompt_kinds": ["IDC", "IRV", "VR", "IDP", "IDL"]}
    assert "completed the variants" not in rh.render_audit({"detectors": detectors, "config": {"columns": every}}, [])
    one = {"columns": {**every, "advprompt_kinds": ["IDP"]}}
    page = rh.render_audit({"detectors": detectors, "config": one}, [])
    assert "AdvPrompt-MIA completed the variants of IDP only (columns.advprompt_kinds;" in page
    # without AdvPrompt-MIA among the detectors the kinds say nothing about the table
    assert "completed the variants" not in rh.render_audit({"detectors": {"min_k": {}}, "config": one}, [])


def test_audit_page_says_what_each_stage_cost():
    stages = {"collect_target": {"seconds": 25.6, "machine_cpu": {"busy_share": 0.99}}, "card": {"seconds": 6.9}}
    page = rh.render_audit({"stages": stages, "timings_s": {"total_this_invocation": 35.2}}, [])
    assert ("<p class=\"note\">Time by stage (wall, in the invocation that ran it; the machine&#x27;s CPUs busy over "
            "it): collect_target 25.6 s (99%), card 6.9 s; this invocation 35 s.</p>") in page
    assert "Time by stage" not in rh.render_audit({}, [])  # a report without markers: no line


def test_simulate_page_says_a_shared_runs_time_is_not_each_detectors_cost():
    shared = {"wall_s": 84.128, "shared_run": ["lr", "mlp"], "trial_s": 4.726}
    assert rh._wall_cell(shared) == ('<td class="num" data-v="84.128">84.1<span class="note"> (shared by 2, own '
                                     'trials 4.7)</span></td>')  # sorted by the run's wall time
    assert "shared" not in rh._wall_cell({"wall_s": 17.3}) and 'data-v="17.3"' in rh._wall_cell({"wall_s": 17.3})
    assert rh._wall_cell({"wall_s": 25.2, "shared_run": ["cgmia", "cgmia_ensemble"]}).endswith(
        '25.2<span class="note"> (shared by 2)</span></td>')


def test_the_page_says_what_happened_to_the_rows_as_report_md_does():
    """Rows failed or degraded, tried again, read back after a kill: in report.md since they were
    counted, and on the page a user opens too (before, only in the markdown)."""
    stages = {"collect_shadow": {"errors": {}, "rows_in": 82},
              "collect_target": {"errors": {"failed:sample_error:ProbeFailed:http_503": 2, HOSTILE: 1},
                                 "row_retries": {"rows": 3, "recovered": 1}, "resumed_rows": 120, "rows_in": 164,
                                 "endpoint_usage": {"requests": 23456, "retries": 67, "prompt_tokens": 1234567,
                                                    "completion_tokens": 89012, "workers": 2, "planned": 20512}}}
    page = rh.render_audit({"stages": stages}, [])
    assert "Row errors by stage: collect_target {&#x27;failed:sample_error:ProbeFailed:http_503&#x27;: 2" in page
    assert "(sample.row_retries): collect_target 3, of which 1 went through" in page
    assert "read back from a killed attempt of the stage (not collected again): collect_target 120 of 164" in page
    assert ("Asked of the endpoint (every attempt of the stage; a batch a kill cut short is left out): collect_target "
            "23,456 requests (67 of them retries, 143.0 requests per task; the plan counted 20,512), 1,234,567 prompt "
            "and 89,012 generated "
            "tokens") in page
    assert "<script>window.__pwned" not in page  # a reason is text, escaped
    assert "Row errors" not in rh.render_audit({"stages": {"collect_target": {"errors": {}}}}, [])


def test_the_simulate_page_says_what_happened_to_the_rows_too(tmp_path):
    """A simulate run's page names rows failed, tried again and read back after a kill, as its
    report.md does (before, only the audit's page said it)."""
    run = _sim_run(tmp_path)
    report = json.loads((run / "report.json").read_text())
    report["stages"] = {"collect_shadow": {"errors": {}, "rows_in": 82},
                        "collect_target": {"errors": {"failed:sample_error:RuntimeError": 1}, "rows_in": 82,
                                           "row_retries": {"rows": 2, "recovered": 2}, "resumed_rows": 40}}
    (run / "report.json").write_text(json.dumps(report))
    page = rh.write_simulate_html(run).read_text()
    assert "Row errors by stage: collect_target {&#x27;failed:sample_error:RuntimeError&#x27;: 1}" in page
    assert "(sample.row_retries): collect_target 2, of which 2 went through" in page
    assert "(not collected again): collect_target 40 of 82" in page
    report["stages"] = {"collect_target": {"errors": {}, "rows_in": 82}}
    (run / "report.json").write_text(json.dumps(report))
    assert "Row errors" not in rh.write_simulate_html(run).read_text()  # nothing happened: no line
