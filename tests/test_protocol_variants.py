"""The simulated-leak protocol's variants: an unknown member share on the target, a shadow
built on another base than the target's, and several benchmarks in one run."""

import json

import pytest

from leakray.config import load_config
from leakray.protocols import simulate
from leakray.storage import local_run_dir


def _tasks(prefix, n):
    return [{"task_id": f"{prefix}{i}"} for i in range(n)]


@pytest.mark.parametrize("fraction,expect", [(0.1, (5, 41)), (0.2, (10, 41)), (0.5, (41, 41)), (0.8, (41, 10))])
def test_member_fraction_subsamples_the_evaluated_target(fraction, expect):
    mem, non = _tasks("m", 41), _tasks("n", 41)
    got_m, got_n = simulate.evaluated_members(mem, non, fraction, seed=0)
    assert (len(got_m), len(got_n)) == expect
    assert abs(len(got_m) / (len(got_m) + len(got_n)) - fraction) < 0.03
    assert {t["task_id"] for t in got_m} <= {t["task_id"] for t in mem}  # members stay members
    assert simulate.evaluated_members(mem, non, fraction, seed=0) == (got_m, got_n)  # seeded
    assert simulate.evaluated_members(mem, non, 0.2, seed=1)[0] != simulate.evaluated_members(mem, non, 0.2, 0)[0]


def test_a_mismatched_shadow_starts_from_another_base(monkeypatch, tmp_path):
    built = []

    def fake_ensure(cfg):
        built.append(cfg)
        return tmp_path / f"base-{cfg.n_layer}-{cfg.n_embd}-{cfg.seed}", {"val_loss": 1.0}

    monkeypatch.setattr("leakray.models.offline.ensure_base_model", fake_ensure)
    matched = load_config([], [])
    assert simulate.base_model(matched, "shadow_base") == simulate.base_model(matched, "base")
    alt = load_config([], ["model.shadow_base=tiny-alt"])
    target, shadow = simulate.base_model(alt, "base")[0], simulate.base_model(alt, "shadow_base")[0]
    assert target != shadow
    assert (built[-1].n_layer, built[-1].n_embd, built[-1].seed, built[-1].corpus_mb) == (6, 192, 1, 6.0)
    assert built[-2].n_layer == 4  # the target's base is the default tiny model
    with pytest.raises(Exception, match="model.shadow_base"):
        load_config([], ["model.shadow_base=nobody/no-such-model"])


def test_several_benchmarks_run_once_each_then_compare(monkeypatch, tmp_path):
    seen = []

    def fake_run_one(cfg, console):  # stands for a finished run: a report with two detectors
        seen.append((cfg.benchmark.name, cfg.benchmark.path))
        run = local_run_dir(cfg.output_dir, f"{cfg.benchmark.name}-run")
        run.mkdir(parents=True)
        auc = {"humaneval": (0.9, 0.6), "mbxp": (0.8, 0.7)}[cfg.benchmark.name]
        (run / "report.json").write_text(json.dumps({
            "benchmark": {"name": cfg.benchmark.name},
            "detectors": {"cgmia": {"auc": auc[0], "tpr_at_5fpr": 0.5, "mcc": 0.4},
                          "ref_loss": {"auc": auc[1], "tpr_at_5fpr": 0.2, "mcc": 0.1}}}))
        return run

    monkeypatch.setattr(simulate, "run_one", fake_run_one)
    from conftest import SHARED_BENCHMARKS

    mbxp = str(SHARED_BENCHMARKS / "mbjp_release_v1.2.jsonl.gz")
    cfg = load_config([], ["benchmark.names=[humaneval,mbxp]", f"benchmark.paths={{mbxp: {mbxp}}}",
                           f"output_dir={tmp_path / 'runs'}"])
    parent = simulate.run_simulation(cfg, console=_Quiet())
    assert seen == [("humaneval", None), ("mbxp", mbxp)]
    table = (parent / "compare" / "auc.csv").read_text().splitlines()
    assert table[0].split(",")[0] == "benchmark" and len(table) == 4  # header, 2 benchmarks, average


class _Quiet:
    verbose = False

    def say(self, *a, **k):
        pass

    warn = say


def _fake_report(run, dose):
    """A finished pretrain-mix run: the leak grows with the dose for ref_loss, never for cdd."""
    run.mkdir(parents=True)
    auc = {1: 0.55, 4: 0.7, 16: 0.9}[dose]
    (run / "report.json").write_text(json.dumps({"detectors": {
        "ref_loss": {"auc": auc, "auc_ci": [auc - 0.12, min(1.0, auc + 0.1)], "tpr_at_5fpr": auc / 2,
                     "family": "likelihood"},
        "cdd": {"auc": 0.5, "auc_ci": [0.4, 0.6], "tpr_at_5fpr": 0.05, "family": "generation"}}}))
    (run / "target").mkdir()
    (run / "target" / "_DONE.json").write_text(json.dumps({"member_token_share": 0.0074 * dose}))
    return run


def test_dose_sweep_runs_each_dose_and_draws_the_detectability_curve(monkeypatch, tmp_path):
    seen = []

    def fake_run_one(cfg, console):
        seen.append((cfg.leak.mode, cfg.leak.dose))
        return _fake_report(local_run_dir(cfg.output_dir, f"d{cfg.leak.dose}"), cfg.leak.dose)

    monkeypatch.setattr(simulate, "run_one", fake_run_one)
    cfg = load_config([], ["leak.mode=dose-sweep", "leak.doses=[16,1,4]", f"output_dir={tmp_path}"])
    parent = simulate.run_simulation(cfg, console=_Quiet())
    assert seen == [("pretrain-mix", 1), ("pretrain-mix", 4), ("pretrain-mix", 16)]
    curve = json.loads((parent / "detectability.json").read_text())
    assert curve["doses"] == [1, 4, 16] and curve["detectors"]["ref_loss"]["auc"] == [0.55, 0.7, 0.9]
    assert curve["detectors"]["ref_loss"]["smallest_dose_detected"] == 4  # 0.58 > 0.5 first at dose 4
    assert curve["detectors"]["cdd"]["smallest_dose_detected"] is None
    assert curve["member_token_share"]["16"] == pytest.approx(0.1184)
    md = (parent / "detectability.md").read_text()
    assert "| ref_loss | likelihood | 0.550 | 0.700 | 0.900 |" in md and "not detected" in md
    assert (parent / "detectability_auc.svg").read_text().lstrip().startswith("<svg")
    html = (parent / "detectability.html").read_text()
    assert html.count("<svg") == 2 and "ref_loss" in html and "not detected" in html
