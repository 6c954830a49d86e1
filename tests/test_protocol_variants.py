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

    def fake_ensure(cfg, progress_file=None):
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
    """A finished pretrain-mix run: the leak grows with the dose for ref_loss, never for cdd, and
    masked_span reads the folds (the same AUC above chance at every dose, the control's too)."""
    run.mkdir(parents=True)
    auc = {0: 0.5, 1: 0.55, 4: 0.7, 16: 0.9}[dose]
    (run / "report.json").write_text(json.dumps({"detectors": {
        "ref_loss": {"auc": auc, "auc_ci": [auc - 0.12, min(1.0, auc + 0.1)], "tpr_at_5fpr": auc / 2,
                     "family": "likelihood"},
        "cdd": {"auc": 0.5, "auc_ci": [0.4, 0.6], "tpr_at_5fpr": 0.05, "family": "generation"},
        "masked_span": {"auc": 0.62, "auc_ci": [0.52, 0.72], "tpr_at_5fpr": 0.1, "family": "generation"}}}))
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


def test_a_dose_sweeps_control_at_dose_zero_is_never_detected_at_and_names_who_reads_the_folds(monkeypatch,
                                                                                                   tmp_path):
    seen = []

    def fake_run_one(cfg, console):
        seen.append(cfg.leak.dose)
        return _fake_report(local_run_dir(cfg.output_dir, f"d{cfg.leak.dose}"), cfg.leak.dose)

    monkeypatch.setattr(simulate, "run_one", fake_run_one)
    cfg = load_config([], ["leak.mode=dose-sweep", "leak.doses=[4,0]", f"output_dir={tmp_path}"])
    parent = simulate.run_simulation(cfg, console=_Quiet())
    assert seen == [0, 4]  # dose 0 is run (no member inserted), not read as "the default dose"
    curve = json.loads((parent / "detectability.json").read_text())["detectors"]
    assert curve["ref_loss"]["smallest_dose_detected"] == 4 and curve["ref_loss"]["control_clears"] is False
    # above 0.5 at every dose, the control included: detected at the first real dose, and marked
    assert curve["masked_span"]["smallest_dose_detected"] == 4 and curve["masked_span"]["control_clears"] is True
    md = (parent / "detectability.md").read_text()
    assert "Dose 0 is the control" in md and "| masked_span | generation | 0.620 | 0.620 |" in md
    assert "4 (*reads the folds*: above 0.5 at dose 0)" in md and md.count("reads the folds*:") == 1
    assert "reads the folds" in (parent / "detectability.html").read_text()
    assert (parent / "detectability_auc.svg").read_text().lstrip().startswith("<svg")  # 0 on the dose axis


# A fan-out's driver killed by SIGKILL inside a child's stage, then run again: the protocol's own
# fan-out (children, parent directory, aggregate) and the real StageRunner markers and kill hook,
# in a subprocess. Each child's model work is replaced by three cheap stages (the heavy stages'
# kill-and-resume is tests/test_e2e.py's): what is checked is the fan-out's resumption.
FAN_OUT_DRIVER = '''
import json, sys
from leakray.config import load_config
from leakray.console import Console
from leakray.protocols import simulate
from leakray.runs import StageRunner, StageSpec
from leakray.storage import local_run_dir


def run_one(cfg, console):
    label = cfg.benchmark.name + "-" + str(cfg.leak.dose if cfg.leak.mode == "pretrain-mix" else 0)
    run = local_run_dir(cfg.output_dir, label)
    runner = StageRunner(run, console)
    auc = {"humaneval": 0.9, "mbxp": 0.8}[cfg.benchmark.name] - (0.3 if cfg.leak.dose == 1 else 0.0)
    runner.run([StageSpec(name, lambda out: {"rows_in": 8, "rows_out": 8}) for name in ("prepare", "collect")])
    (run / "report.json").write_text(json.dumps({
        "benchmark": {"name": cfg.benchmark.name},
        "detectors": {name: {"auc": auc, "auc_ci": [auc - 0.1, auc + 0.05], "tpr_at_5fpr": 0.5, "mcc": 0.4,
                             "family": "likelihood"} for name in ("cgmia", "ref_loss")}}))
    (run / "target").mkdir(exist_ok=True)
    (run / "target" / "_DONE.json").write_text(json.dumps({"member_token_share": 0.01 * cfg.leak.dose}))
    return run


simulate.run_one = run_one
print(simulate.run_simulation(load_config([], sys.argv[1:]), Console(stream=sys.stderr)))
'''


@pytest.mark.parametrize("kind", ["multi-benchmark", "dose-sweep"])
def test_a_fan_out_killed_mid_stage_resumes_from_its_markers(tmp_path, kind):
    import os
    import subprocess
    import sys

    from conftest import ROOT, SHARED_BENCHMARKS
    from leakray.runs import KILL_ENV

    script = tmp_path / "driver.py"
    script.write_text(FAN_OUT_DRIVER)
    out = tmp_path / "runs"
    args = {"multi-benchmark": ["benchmark.names=[humaneval,mbxp]",
                                f"benchmark.paths={{mbxp: {SHARED_BENCHMARKS / 'mbjp_release_v1.2.jsonl.gz'}}}"],
            "dose-sweep": ["leak.mode=dose-sweep", "leak.doses=[1,4]"]}[kind] + [f"output_dir={out}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def drive(**extra):
        return subprocess.run([sys.executable, str(script), *args], env={**env, **extra}, capture_output=True,
                              text=True, timeout=300, cwd=ROOT)

    killed = drive(**{KILL_ENV: "collect"})  # dies inside the first child's collect stage
    assert killed.returncode == -9, killed.stderr[-2000:]
    (parent,) = out.iterdir()
    (first,) = [d for d in parent.iterdir() if (d / "prepare" / "_DONE.json").exists()]
    assert (first / "collect" / "partial.tmp").exists() and not (first / "collect" / "_DONE.json").exists()
    before = (first / "prepare" / "_DONE.json").stat().st_mtime
    done = drive()
    assert done.returncode == 0, done.stderr[-2000:]
    assert (first / "prepare" / "_DONE.json").stat().st_mtime == before  # resumed, not redone
    assert not (first / "collect" / "partial.tmp").exists()  # the unfinished stage started empty
    children = [d for d in parent.iterdir() if (d / "report.json").exists()]
    assert len(children) == 2 and all((d / "collect" / "_DONE.json").exists() for d in children)
    if kind == "multi-benchmark":
        assert len((parent / "compare" / "auc.csv").read_text().splitlines()) == 4  # header, 2 benchmarks, mean
    else:
        assert json.loads((parent / "detectability.json").read_text())["doses"] == [1, 4]
    again = drive()  # a finished fan-out: every child is done, the aggregate is rewritten
    assert again.returncode == 0 and (first / "prepare" / "_DONE.json").stat().st_mtime == before
