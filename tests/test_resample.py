"""The routes' bootstraps draw a benchmark's near-copies as one task (`evaluate.resample`): a pair
counted as two independent draws makes the leaked fraction's interval too narrow."""

import numpy as np
import pytest

from leakray.evaluate.resample import group_index, resampled_by, task_resamples


def _benchmark(seed: int, n: int = 120):
    """``n`` tasks, a fifth leaked (their statistic well above the clean bulk's)."""
    rng = np.random.default_rng(seed)
    return np.r_[rng.normal(0, 1, n - n // 5), rng.normal(4, 0.6, n // 5)], [f"t{i}" for i in range(n)]


def _width(r: dict) -> float:
    return r["ci"][1] - r["ci"][0]


def test_without_groups_the_draws_are_the_task_by_task_ones():
    units = group_index([f"t{i}" for i in range(50)], [["t1"], []])  # a group of one is no group
    assert len(set(units)) == 50 and resampled_by(units) == "task"
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    np.testing.assert_array_equal(task_resamples(units, 20, a), np.stack([b.integers(0, 50, 50) for _ in range(20)]))
    assert a.integers(0, 10**9) == b.integers(0, 10**9)  # and the stream left where it was


def test_a_group_is_drawn_whole_and_every_resample_keeps_the_benchmarks_size():
    ids = [f"t{i}" for i in range(30)]
    units = group_index(ids, [["t0", "t7", "t9"], ["t3", "t4"]])
    assert units[0] == units[7] == units[9] != units[3] == units[4] and len(set(units)) == 27
    assert "2 group(s)" in resampled_by(units)
    rows = task_resamples(units, 200, np.random.default_rng(0))
    assert rows.shape == (200, 30)
    for r in rows:
        for group in ([0, 7, 9], [3, 4]):
            # a group's rows come in whole runs: the same number of each (the last run may be cut at 30)
            counts = [int((r[:-3] == i).sum()) for i in group]
            assert max(counts) - min(counts) <= 1
    assert (rows == 0).any(axis=1).mean() > 0.5  # drawn often enough to have been checked


def test_self_calibrated_interval_of_a_benchmark_read_twice_is_that_of_the_benchmark():
    from leakray.evaluate.selfcal import estimate_empirical

    for seed in range(3):
        s, ids = _benchmark(seed)
        twice, ids2 = np.r_[s, s], ids + [f"copy-{t}" for t in ids]
        groups = [[t, f"copy-{t}"] for t in ids]
        once = estimate_empirical(ids, s, [""] * len(s), n_boot=300, seed=1)
        naive = estimate_empirical(ids2, twice, [""] * len(twice), n_boot=300, seed=1)
        grouped = estimate_empirical(ids2, twice, [""] * len(twice), n_boot=300, seed=1, groups=groups)
        assert grouped["estimate"] == naive["estimate"] == once["estimate"]
        # every task counted twice: the interval claims sqrt(2) the tasks there are
        assert _width(naive) < 0.8 * _width(once)
        assert abs(_width(grouped) / _width(once) - 1) < 0.1
        assert grouped["resampled_by"].startswith("near-copy group") and once["resampled_by"] == "task"


def test_control_route_draws_the_benchmarks_groups_whole():
    from leakray.evaluate.control_route import conformal_pvalues, estimate_control, leaked_share

    narrower = 0
    for seed in range(3):
        rng = np.random.default_rng(seed)
        s, ids = _benchmark(seed, 80)
        # many control tasks, so that the benchmark's own draws are what the interval's width is made of
        control = rng.normal(0, 1, 1500)
        ids2, twice = ids + [f"copy-{t}" for t in ids], np.r_[s, s]

        def route(ids, s, **groups):
            n = len(s)
            return estimate_control(ids, s, [""] * n, control, ref_bench=np.zeros(n), ref_control=np.zeros(1500),
                                    len_bench=np.ones(n), len_control=np.ones(1500), n_boot=300, seed=2, adjust=False,
                                    **groups)

        once, naive = route(ids, s), route(ids2, twice)
        grouped = route(ids2, twice, groups=[[t, f"copy-{t}"] for t in ids])
        assert grouped["estimate"] == naive["estimate"] == once["estimate"]
        assert abs(_width(grouped) / _width(once) - 1) < 0.1
        narrower += _width(naive) < 0.9 * _width(once)
        assert naive["resampled_by"] == "task" and grouped["resampled_by"].startswith("near-copy group")
    assert narrower >= 2
    # without groups, the draws as before groups existed (each resample's benchmark rows, then its control rows)
    draws = np.random.default_rng(2)
    boots = [leaked_share(conformal_pvalues(twice[draws.integers(0, 160, 160)], control[draws.integers(0, 1500, 1500)]),
                          0.5) for _ in range(300)]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    assert naive["ci"] == [float(min(lo, naive["estimate"])), float(max(hi, naive["estimate"]))]


def test_detector_intervals_draw_a_group_whole():
    """`binary_metrics`' AUC and TPR intervals (every detector's, in simulate and in cards): a target
    whose every task is there twice gets the interval of its single copy, not a narrower one."""
    from leakray.evaluate.metrics import binary_metrics

    rng = np.random.default_rng(0)
    y = np.r_[np.ones(40, int), np.zeros(40, int)]
    s = rng.normal(size=80) + 1.0 * y
    pred = (s > 0.5).astype(int)
    once = binary_metrics(y, s, pred, n_bootstrap=2000, bootstrap_seed=3)
    y2, s2, p2 = np.r_[y, y], np.r_[s, s], np.r_[pred, pred]
    naive = binary_metrics(y2, s2, p2, n_bootstrap=2000, bootstrap_seed=3)
    grouped = binary_metrics(y2, s2, p2, n_bootstrap=2000, bootstrap_seed=3, groups=np.r_[np.arange(80), np.arange(80)])
    width = lambda m: m["auc_ci"][1] - m["auc_ci"][0]  # noqa: E731
    assert grouped["auc"] == naive["auc"] == once["auc"]
    assert width(naive) < 0.8 * width(once) and abs(width(grouped) / width(once) - 1) < 0.1
    assert grouped["bootstrap"]["method"].endswith("near-copy groups drawn whole")
    assert "near-copy" not in naive["bootstrap"]["method"]
    # every row its own group: scipy's bootstrap, as before groups existed
    alone = binary_metrics(y, s, pred, n_bootstrap=500, bootstrap_seed=3, groups=np.arange(80))
    assert alone["auc_ci"] == binary_metrics(y, s, pred, n_bootstrap=500, bootstrap_seed=3)["auc_ci"]


def test_inflation_interval_draws_a_group_whole_and_is_unchanged_without_one():
    from leakray.evaluate.inflation import inflation

    rng = np.random.default_rng(1)
    pass1 = np.r_[rng.uniform(0.4, 1.0, 20), rng.uniform(0.0, 0.5, 60)]
    flagged = np.r_[np.ones(20, bool), np.zeros(60, bool)]
    once = inflation(pass1, flagged, n_boot=2000, seed=4)
    # the draws as before groups existed (rng.choice on each side)
    draws = np.random.default_rng(4)
    diffs = [draws.choice(pass1[:20], 20).mean() - draws.choice(pass1[20:], 60).mean() for _ in range(2000)]
    assert once["difference_ci"] == np.percentile(diffs, [2.5, 97.5]).tolist()
    assert inflation(pass1, flagged, n_boot=2000, seed=4, groups=np.arange(80))["difference_ci"] == once["difference_ci"]
    twice, f2 = np.r_[pass1, pass1], np.r_[flagged, flagged]
    naive = inflation(twice, f2, n_boot=2000, seed=4)
    grouped = inflation(twice, f2, n_boot=2000, seed=4, groups=np.r_[np.arange(80), np.arange(80)])
    width = lambda r: r["difference_ci"][1] - r["difference_ci"][0]  # noqa: E731
    assert width(naive) < 0.8 * width(once) and abs(width(grouped) / width(once) - 1) < 0.1


def test_card_route_mixture_draws_the_targets_groups_whole():
    from leakray.evaluate.card_route import mixture_estimate

    width = lambda r: r["fixed_scale_ci"][1] - r["fixed_scale_ci"][0]  # noqa: E731
    widths = {"once": [], "naive": [], "grouped": []}
    for seed in range(6):
        rng = np.random.default_rng(seed)
        y = np.r_[np.ones(40, int), np.zeros(40, int)]
        s = rng.normal(size=80) + 2.0 * y  # the card's held-out rows
        t = np.r_[rng.normal(size=48), rng.normal(size=12) + 2.0]  # a target, a fifth leaked
        once = mixture_estimate(t, y, s, n_boot=300, seed=1)
        assert mixture_estimate(t, y, s, n_boot=300, seed=1, groups=np.arange(60)) == once  # the same draws
        naive = mixture_estimate(np.r_[t, t], y, s, n_boot=300, seed=1)
        grouped = mixture_estimate(np.r_[t, t], y, s, n_boot=300, seed=1, groups=np.r_[np.arange(60), np.arange(60)])
        assert grouped["estimate"] == naive["estimate"]
        for name, r in (("once", once), ("naive", naive), ("grouped", grouped)):
            widths[name].append(width(r))
    mean = {k: float(np.mean(v)) for k, v in widths.items()}
    # the card's rows are drawn alike in all three: drawn whole, the target read twice is about the
    # target read once (measured 0.95 of it), task by task narrower (0.85)
    assert abs(mean["grouped"] / mean["once"] - 1) < 0.1 and mean["naive"] < 0.92 * mean["once"], mean


def test_inflation_null_draws_the_audited_tasks_groups_whole(tmp_path):
    """The leak-free split's interval (the card's shadow on its non-members) draws a near-copy group
    whole, as the observed split's does: a benchmark read twice gives the interval of it read once."""
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from leakray.report.audit import inflation_null

    rng = np.random.default_rng(2)
    ids = [f"t{i}" for i in range(80)]
    pass1 = np.r_[rng.uniform(0.4, 1.0, 20), rng.uniform(0.0, 0.5, 60)]
    twice = ids + [f"{t}-copy" for t in ids]
    pq.write_table(pa.Table.from_pylist([{"task_id": t, "member": 0, "pass1": float(p)}
                                         for t, p in zip(twice, np.r_[pass1, pass1])]),
                   tmp_path / "shadow_tasks.parquet")
    card, a = SimpleNamespace(path=tmp_path), SimpleNamespace(bootstrap=2000, shadow_seed=4)
    flagged = np.r_[np.ones(20, bool), np.zeros(60, bool)]
    width = lambda r: r["difference_ci"][1] - r["difference_ci"][0]  # noqa: E731
    once = inflation_null(card, ids, flagged, {"difference": 0.3}, a)
    f2 = np.r_[flagged, flagged]
    naive = inflation_null(card, twice, f2, {"difference": 0.3}, a)
    grouped = inflation_null(card, twice, f2, {"difference": 0.3}, a, groups=group_index(twice, [[t, f"{t}-copy"]
                                                                                                 for t in ids]))
    assert once["n_tasks"] == 80 and grouped["n_tasks"] == 160
    assert grouped["difference"] == naive["difference"] == pytest.approx(once["difference"], abs=1e-12)
    assert width(naive) < 0.8 * width(once) and abs(width(grouped) / width(once) - 1) < 0.1
    # every task its own group: the same draws as without groups
    assert inflation_null(card, ids, flagged, {"difference": 0.3}, a, groups=np.arange(80)) == once


def test_transfer_check_null_draws_the_targets_groups_whole():
    """A target read twice (every task a near-copy pair) that is the card's mixture: task by task, the
    KS null is that of a sample twice as large, so the duplicated scores' distance looks
    improbable; drawn by group, the p-values are those of the target read once."""
    from leakray.evaluate.card_route import transfer_check

    p = {"once": [], "naive": [], "grouped": []}
    for seed in range(6):
        rng = np.random.default_rng(seed)
        # the card's held-out rows: many, so that the null's spread is mostly the target's own
        y = np.r_[np.ones(200, int), np.zeros(200, int)]
        s = rng.normal(size=400) + 2.0 * y
        t = np.r_[rng.normal(size=48), rng.normal(size=12) + 2.0]  # a target on the card's scale
        once = transfer_check(t, y, s, n_boot=60, seed=1)
        assert transfer_check(t, y, s, n_boot=60, seed=1, groups=np.arange(60)) == once  # the same draws
        p["once"].append(once["p"])
        p["naive"].append(transfer_check(np.r_[t, t], y, s, n_boot=60, seed=1)["p"])
        p["grouped"].append(transfer_check(np.r_[t, t], y, s, n_boot=60, seed=1,
                                           groups=np.r_[np.arange(60), np.arange(60)])["p"])
    mean = {k: float(np.mean(v)) for k, v in p.items()}
    # measured: task by task 0.69 of the p-value once, drawn by group 1.02 (0.53-0.69 and 0.94-1.02
    # over three sets of six seeds)
    assert mean["naive"] < 0.75 * mean["once"] and abs(mean["grouped"] / mean["once"] - 1) < 0.15, mean
