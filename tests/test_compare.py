"""`leakray compare`: the statistics against scipy / brute force, the tables on synthetic run dirs, the CLI."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from scipy.stats import false_discovery_control, wilcoxon

from leakray.cli import main
from leakray.evaluate import stats
from leakray.report.compare import NEEDS_TWO, compare

# ---- statistics -----------------------------------------------------------------------------


def test_cliffs_delta_matches_brute_force():
    x = np.array([0.91, 0.80, 0.70, 0.95, 0.62])
    y = np.array([0.85, 0.80, 0.60, 0.99])
    gt = sum(a > b for a in x for b in y)
    lt = sum(a < b for a in x for b in y)
    assert stats.cliffs_delta(x, y) == pytest.approx((gt - lt) / (len(x) * len(y)))
    assert stats.cliffs_delta(x, y) == pytest.approx((9 - 10) / 20)  # counted by hand: 9 pairs x > y, 10 x < y, 1 tie
    assert stats.cliffs_delta([3, 4], [1, 2]) == 1.0
    assert stats.cliffs_delta([1, 2], [3, 4]) == -1.0


@pytest.mark.parametrize("delta, label", [(0.0, "negligible"), (0.146, "negligible"), (-0.147, "small"),
                                          (0.329, "small"), (0.33, "medium"), (-0.473, "medium"),
                                          (0.474, "large"), (-1.0, "large")])
def test_magnitude_romano_thresholds(delta, label):
    assert stats.magnitude(delta) == label


def test_bh_adjust_matches_scipy_and_hand_values():
    ps = [0.01, None, 0.04, 0.03]
    got = stats.bh_adjust(ps)
    want = false_discovery_control([0.01, 0.04, 0.03], method="bh")
    assert got[1] is None  # a missing p is not part of the family
    assert [got[0], got[2], got[3]] == pytest.approx(list(want))
    # by hand, m = 3: sorted 0.01, 0.03, 0.04 -> 0.03, 0.045, 0.04 -> step-up minimum 0.03, 0.04, 0.04
    assert [got[0], got[2], got[3]] == pytest.approx([0.03, 0.04, 0.04])
    assert stats.bh_adjust([None, None]) == [None, None]


def test_paired_wilcoxon_matches_scipy():
    x = np.array([0.91, 0.85, 0.77, 0.66, 0.95, 0.70, 0.81])
    y = np.array([0.88, 0.86, 0.70, 0.60, 0.90, 0.71, 0.73])
    res = stats.paired_wilcoxon(x, y)
    ref = wilcoxon(x - y)
    assert res["p"] == pytest.approx(ref.pvalue) and res["statistic"] == pytest.approx(ref.statistic)
    assert res["p"] == pytest.approx(wilcoxon(x, y).pvalue)
    assert res["n"] == 7 and res["n_nonzero"] == 7 and res["reason"] is None
    # all six differences positive, no ties: exact two-sided p = 2 / 2**6
    up = stats.paired_wilcoxon([1, 2, 3, 4, 5, 6], [0.5, 1.4, 2.3, 3.2, 4.1, 5.0])
    assert up["p"] == pytest.approx(2 / 64) and up["min_attainable_p"] == pytest.approx(2 / 64)


def test_paired_wilcoxon_says_why_when_it_cannot_test():
    zero = stats.paired_wilcoxon([0.5, 0.7, 0.9], [0.5, 0.7, 0.9])
    assert zero["p"] is None and "zero" in zero["reason"] and zero["min_attainable_p"] is None
    one = stats.paired_wilcoxon([0.9], [0.5])
    assert one["p"] is None and ">= 2" in one["reason"]
    with pytest.raises(ValueError):
        stats.paired_wilcoxon([0.9, np.nan], [0.5, 0.4])


def test_win_draw_loss_counts():
    x = [0.90, 0.800, 0.70, 0.5, 0.60]
    y = [0.80, 0.797, 0.75, 0.5, 0.62]
    assert stats.win_draw_loss(x, y, tol=0.005) == (1, 2, 2)  # +0.1 W, +0.003 D, -0.05 L, 0 D, -0.02 L
    assert stats.win_draw_loss(x, y, tol=0.0) == (2, 1, 2)
    assert stats.win_draw_loss(x, y, tol=0.03) == (1, 3, 1)


# ---- compare on synthetic run dirs ----------------------------------------------------------

METRIC_KEYS = ("auc", "tpr_at_5fpr", "tpr_at_1fpr", "mcc", "precision", "recall")


def _report(path, benchmark, aucs: dict, run=None):
    """A report.json shaped like simulate's: every metric = auc - 0.1 except auc itself."""
    path.mkdir(parents=True, exist_ok=True)
    dets = {name: {**{m: (None if a is None else a if m == "auc" else a - 0.1) for m in METRIC_KEYS},
                   "auc_ci": [0, 1], "family": "likelihood", "access": "logprobs"} for name, a in aucs.items()}
    rep = {"benchmark": {"name": benchmark, "path": None}, "run": run or path.name, "detectors": dets}
    (path / "report.json").write_text(json.dumps(rep))
    return path


AUCS = {  # benchmark -> detector -> auc; zlib has no classeval row
    "humaneval": {"cgmia": 0.95, "ref_loss": 0.90, "zlib": 0.70},
    "mbpp": {"cgmia": 0.80, "ref_loss": 0.803, "zlib": 0.60},
    "classeval": {"cgmia": 0.70, "ref_loss": 0.75},
}


@pytest.fixture
def runs(tmp_path):
    multi = tmp_path / "multi-run"  # a multi-benchmark run: per-benchmark run dirs under it plus a summary
    _report(multi / "humaneval-aa", "humaneval", AUCS["humaneval"])
    _report(multi / "mbpp-bb", "mbpp", AUCS["mbpp"])
    (multi / "report.json").write_text(json.dumps({"benchmark": {"names": ["humaneval", "mbpp"]},
                                                   "detectors": {"cgmia": {"auc": 0.5}}}))
    single = _report(tmp_path / "classeval-cc", "classeval", AUCS["classeval"])
    return multi, single


def test_compare_writes_tables_and_statistics(runs, tmp_path):
    out = tmp_path / "out"
    result = compare(list(runs), out, metrics=("auc", "mcc"), plots=False)
    assert result["n_benchmarks"] == 3 and any("skipped" in n for n in result["notes"])  # the summary
    for f in ("compare.md", "compare.json", "auc.md", "auc.csv", "auc_stats.csv", "mcc.csv"):
        assert (out / f).is_file(), f
    assert not (out / "recall.csv").exists()

    with (out / "auc.csv").open() as fh:
        table = list(csv.reader(fh))
    assert len(table) == 1 + 3 + 1 and all(len(r) == 1 + 3 for r in table)  # header, 3 benchmarks, average
    means = {"cgmia": (0.95 + 0.80 + 0.70) / 3, "ref_loss": (0.90 + 0.803 + 0.75) / 3, "zlib": 0.65}
    assert table[0] == ["benchmark", "ref_loss", "cgmia", "zlib"]  # ordered by mean, descending
    assert {r[0] for r in table[1:4]} == {"humaneval", "mbpp", "classeval"} and table[-1][0] == "average"
    assert [float(v) for v in table[-1][1:]] == pytest.approx([means[d] for d in table[0][1:]])
    classeval = next(r for r in table if r[0] == "classeval")
    assert classeval[3] == ""  # missing zlib stays empty, not 0

    st = {r["detector"]: r for r in result["statistics"]["auc"]["rows"]}
    assert set(st) == {"ref_loss", "zlib"}
    # cgmia - ref_loss: +0.05 W, -0.003 D, -0.05 L
    assert (st["ref_loss"]["wins"], st["ref_loss"]["draws"], st["ref_loss"]["losses"]) == (1, 1, 1)
    x, y = np.array([0.95, 0.80, 0.70]), np.array([0.90, 0.803, 0.75])
    order = [b["row"] for b in result["benchmarks"]]
    idx = [["humaneval", "mbpp", "classeval"].index(b) for b in order]
    assert st["ref_loss"]["wilcoxon_p"] == pytest.approx(wilcoxon(x[idx] - y[idx]).pvalue)
    assert st["ref_loss"]["cliffs_delta"] == pytest.approx(stats.cliffs_delta(x, y))
    assert st["zlib"]["n"] == 2 and (st["zlib"]["wins"], st["zlib"]["losses"]) == (2, 0)  # classeval left out
    bh = false_discovery_control([st["ref_loss"]["wilcoxon_p"], st["zlib"]["wilcoxon_p"]], method="bh")
    assert [st["ref_loss"]["bh_p"], st["zlib"]["bh_p"]] == pytest.approx(list(bh))
    assert result["statistics"]["auc"]["best_baseline"] == "ref_loss"
    md = (out / "compare.md").read_text()
    assert "n = 3" in md and "cgmia" in md and "1/1/1" in md and "## mcc" in md
    assert json.loads((out / "compare.json").read_text())["tables"]["auc"]["rows"]["classeval"]["zlib"] is None


def test_same_benchmark_twice_is_named_by_run_dir(tmp_path):
    a = _report(tmp_path / "runs" / "humaneval-1", "humaneval", {"cgmia": 0.9, "ref_loss": 0.8})
    b = _report(tmp_path / "runs" / "humaneval-2", "humaneval", {"cgmia": 0.7, "ref_loss": 0.6})
    result = compare([tmp_path / "runs"], tmp_path / "out", metrics=("auc",), plots=False)
    assert {r["row"] for r in result["benchmarks"]} == {"humaneval (humaneval-1)", "humaneval (humaneval-2)"}
    assert any("appears in 2 reports" in n for n in result["notes"])
    assert {r["run_dir"] for r in result["benchmarks"]} == {str(a.resolve()), str(b.resolve())}


def test_one_benchmark_writes_tables_statistics_na(tmp_path):
    run = _report(tmp_path / "he", "humaneval", {"cgmia": 0.9, "ref_loss": 0.8})
    result = compare([run], tmp_path / "out", metrics=("auc",), plots=False)
    assert result["statistics"]["auc"]["status"] == NEEDS_TWO
    assert (tmp_path / "out" / "auc.csv").is_file() and NEEDS_TWO in (tmp_path / "out" / "compare.md").read_text()


# ---- CLI ------------------------------------------------------------------------------------


def test_cli_writes_report_with_plots(runs, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), "--output", str(out), "--metrics", "auc"]) == 0
    md = (out / "compare.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(images) == ["bars_auc.png", "heatmap_auc.png"]
    for im in images:
        assert (out / im).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra, needle", [
    (["--reference", "nope"], "unknown reference detector 'nope'"),
    (["--metrics", "auc,f9"], "unknown metric"),
    (["--detectors", "zlib,ghost"], "unknown detector"),
])
def test_cli_refuses_bad_options(runs, tmp_path, capsys, extra, needle):
    assert main(["compare", *map(str, runs), "--output", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_cli_refuses_dir_without_report(runs, tmp_path, capsys):
    empty = tmp_path / "empty-run"
    (empty / "detect").mkdir(parents=True)
    assert main(["compare", str(runs[1]), str(empty), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(empty) in err and "no report.json" in err and len(err.splitlines()) == 1
