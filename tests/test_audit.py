"""`leakray audit`: calibration and inflation on fixed
synthetic inputs, a detector card's save/reuse, and the audit end to end on a local Ray
(a planted leak, then the same audit again from its card with no fine-tuning)."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cgmia_data import synthetic_collection
from conftest import ROOT

from leakray.errors import BadInput
from leakray.evaluate.calibration import Calibrator, calibration_report, fit_calibrator, reliability
from leakray.evaluate.inflation import inflation


def _scores(n_pos, n_neg, rng, shift=1.5):
    return np.concatenate([rng.normal(shift, 1, n_pos), rng.normal(0, 1, n_neg)])


@pytest.mark.parametrize("method", ["isotonic", "platt"])
def test_calibrator_round_trip_and_quality(method):
    rng = np.random.default_rng(2)
    y = np.r_[np.ones(200, int), np.zeros(200, int)]
    s = _scores(200, 200, rng, shift=2.0)
    cal = fit_calibrator(y, s, method)
    again = Calibrator.from_dict(json.loads(json.dumps(cal.to_dict())))
    grid = np.linspace(-3, 5, 50)
    assert np.allclose(cal.predict(grid), again.predict(grid))
    assert np.all(np.diff(cal.predict(grid)) >= -1e-12) and cal.predict(grid).min() >= 0 and cal.predict(grid).max() <= 1
    q = calibration_report(y, s, method)
    assert q["brier"] < q["brier_base_rate"] - 0.05  # informative scores beat the base rate, out of fold
    rel = reliability(y, cal.predict(s))
    assert sum(rel["count"]) == len(y) and len(rel["mean_predicted"]) == len(rel["fraction_positive"])
    with pytest.raises(BadInput):
        fit_calibrator(np.ones(5, int), np.arange(5.0))


def test_inflation_ratio_and_unbounded_case():
    pass1 = np.r_[np.full(10, 0.5), np.full(30, 0.1), [np.nan]]
    flagged = np.r_[np.ones(10, bool), np.zeros(31, bool)]
    out = inflation(pass1, flagged, n_boot=200)
    assert out["ratio"] == pytest.approx(5.0) and out["n_flagged"] == 10 and out["n_tested"] == 40
    assert out["score_clean"] == pytest.approx(0.1) and out["score_all"] == pytest.approx((5 + 3) / 40)
    zero = inflation(np.r_[np.full(5, 0.4), np.zeros(5)], np.r_[np.ones(5, bool), np.zeros(5, bool)], n_boot=50)
    assert zero["ratio"] is None and "unbounded" in zero["why"] and zero["difference"] == pytest.approx(0.4)


def test_card_saves_and_reuses_the_same_scores(tmp_path):
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.detect.card import DetectorCard
    from leakray.detect import registry
    from leakray.protocols.card import build_card

    cfg = load_config([AUDIT_DEFAULTS], ["detect.detectors=[cgmia,ref_loss]", "detect.use_ray_train=false",
                                         "detect.cgmia.epochs=3", "detect.bootstrap=20"], AuditConfig)
    shadow = synthetic_collection(n=80, seed=3, signal=1.0, prefix="s")
    target = synthetic_collection(n=40, seed=4, signal=1.0, prefix="t")
    card = build_card(shadow, cfg, tmp_path / "card", storage=tmp_path / "ray", meta={"benchmark": {"name": "x"}})
    assert set(card.names) == {"cgmia", "ref_loss"} and card.meta["n_val"] == 40
    first, skipped = card.score(target)
    again, _ = DetectorCard(tmp_path / "card").score(target)  # a fresh load: weights and projections from disk
    for name in card.names:
        assert np.array_equal(first[name], again[name])
        y, s = card.val_scores(name)
        assert len(y) == 40 and set(np.unique(y)) == {0, 1}
    assert card.meta["detectors"]["cgmia"]["suspect_cut"]["fpr"] <= 0.05
    # the card route's distributions: every shadow row for a detector that learnt nothing (its scores
    # on the fit half are the detector's own, untouched), only the held-out half for one that learnt
    y_all, s_all = card.shadow_scores("ref_loss")
    assert len(y_all) == 80 and y_all.sum() == shadow.column("member").to_numpy().sum()
    fit_ids = set(card.meta["fit_task_ids"])
    fit_rows = shadow.filter(pa.array([t in fit_ids for t in shadow.column("task_id").to_pylist()]))
    np.testing.assert_allclose(np.sort(s_all), np.sort(np.r_[card.val_scores("ref_loss")[1],
                                                             registry.make("ref_loss").score(fit_rows)]))
    assert len(card.shadow_scores("cgmia")[0]) == 40
    with pytest.raises(BadInput):
        DetectorCard(tmp_path)  # no card.json


def test_audit_flags_are_config_overrides():
    from leakray.commands.run import audit_overrides
    from leakray.cli import build_parser

    args = build_parser().parse_args(["audit", "--target", "m/x", "--benchmark", "mbpp=/d/m.jsonl",
                                      "--shadow-base", "b/y", "--card", "/c", "--corpus", "/k/*.py"])
    assert audit_overrides(args) == ["audit.target=m/x", "benchmark.name=mbpp", "benchmark.path=/d/m.jsonl",
                                     "model.base=b/y", "audit.card=/c", "audit.corpus=/k/*.py"]


def test_audit_refuses_bad_input(tmp_path):
    from leakray.cli import main

    assert main(["audit", "--card", str(tmp_path)]) == 2  # not a card
    assert main(["audit", "--set", "audit.member_fraction=1.5"]) == 2
    assert main(["audit", "--set", "audit.detector=cgmai"]) == 2


AUDIT = ["--quick", "--set", "detect.detectors=[ref_loss,min_k,gt_match,cgmia,advprompt,toy]", "--set", "audit.member_fraction=0.25",
         "--set", "columns.upper_case=false", "--set", "detect.trace_memory=false"]


@pytest.mark.slow
# generous guards: three invocations (killed, resumed, card reused) on a possibly busy 2-core machine
@pytest.mark.timeout(2400)
def test_audit_end_to_end_then_reuse_card(ray_head, tmp_path, leakray_cache):
    _, _, gcs, env = ray_head
    out = tmp_path / "runs"
    # a detector kept outside leakray (one file + one entry) goes into the card and the audit
    env = dict(env, LEAKRAY_CACHE=str(leakray_cache), LEAKRAY_DETECTORS="toy=tests/plugins/toy_detector.py:Toy")

    def audit(*extra):
        proc = subprocess.run([sys.executable, "-m", "leakray.cli", "audit", *AUDIT, *extra, "--output", str(out),
                               "--address", gcs], env=env, capture_output=True, text=True, timeout=1500, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    corpus = ["--corpus", str(ROOT / "tests" / "fixtures" / "screen" / "corpus")]  # holds a copy of HumanEval/0
    # killed (SIGKILL) while building the card; the next invocation resumes at the card
    killed = subprocess.run([sys.executable, "-m", "leakray.cli", "audit", *AUDIT, *corpus, "--output", str(out),
                             "--address", gcs], env=dict(env, LEAKRAY_KILL_IN_STAGE="card"), capture_output=True,
                            text=True, timeout=1500, cwd=ROOT)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (run,) = out.glob("audit-*")
    assert not (run / "card" / "_DONE.json").exists() and (run / "card" / "partial.tmp").exists()
    before_kill = {p.parent.name: p.stat().st_mtime for p in run.glob("*/_DONE.json")}
    assert set(before_kill) >= {"split", "base", "perturb", "shadow", "collect_shadow"}
    audit(*corpus)
    assert {p.parent.name: p.stat().st_mtime for p in run.glob("*/_DONE.json") if p.parent.name in before_kill} \
        == before_kill
    report = json.loads((run / "report.json").read_text())
    s = report["summary"]
    assert s["n_tasks"] == 32 and sum(s["verdicts"].values()) == 32
    lf = s["leaked_fraction"]
    assert lf["truth"] == 0.25
    # against the prebuilt tiny-alt reference the self-calibrated route sees the planted 25% even on
    # 32 tasks (measured: 27.7% [15.5%, 40.7%]; with a 30-step stand-in reference it could not tell).
    # docs/AUDIT.md has the validation matrix.
    assert s["self_calibrated"]["n_tasks"] == 32 and s["self_calibrated"]["usable"]
    assert lf["route"] == "self-calibrated" and lf["ci"][0] <= lf["truth"] <= lf["ci"][1]
    assert abs(lf["estimate"] - lf["truth"]) <= 0.10 and s["verdicts"]["suspected"] >= 1
    assert set(s["crossfit"]["detectors"]) == {"cgmia", "advprompt"}  # learned: scored only held-out tasks
    card = json.loads((run / "card" / "card.json").read_text())
    assert {"toy", "advprompt"} <= set(card["detectors"])  # a plug-in and AdvPrompt-MIA are in the card
    assert {"toy", "advprompt"} <= set(report["truth"]["target_auc"])  # and scored in the audit
    assert report["truth"]["target_auc"]["ref_loss"] >= 0.9  # the planted leak is real
    samples = pq.read_table(run / "samples.parquet").to_pylist()
    assert len(samples) == 32 and {r["verdict"] for r in samples} <= {"confirmed", "suspected", "clean"}
    confirmed = [r for r in samples if r["verdict"] == "confirmed"]
    assert [r["task_id"] for r in confirmed] == ["HumanEval/0"] and max(confirmed[0]["jaccard"], confirmed[0]["containment"]) >= 0.7
    assert "copy_he0.py" in confirmed[0]["evidence"]
    assert all(0 <= r["probability"] <= 1 for r in samples)
    removed = (run / "cleaned" / "removed_ids.txt").read_text().split()
    assert len(removed) == s["inflation"]["n_flagged"] == s["verdicts"]["suspected"] + 1
    assert (run / "cleaned" / "HumanEval.jsonl.gz").exists() and (run / "report.html").exists()
    assert (run / "report.md").read_text().startswith("# leakray audit")

    # the card reused on a given target (the planted model, by path) over 8 of the tasks: no shadow,
    # no detector fitting, and per task the very scores the card-building audit gave (a second
    # 32-task collection would double this test's time for the same check)
    audit("--card", str(run / "card"), "--target", str(run / "target" / "model"), "--set", "benchmark.limit=8")
    (reuse,) = [d for d in out.glob("audit-*") if d != run]
    assert not (reuse / "shadow").exists() and not (reuse / "card").exists() and not (reuse / "target").exists()
    r2 = json.loads((reuse / "report.json").read_text())
    assert r2["summary"]["card"] == s["card"] and r2["summary"]["n_tasks"] == 8
    assert "truth" not in r2["summary"]["leaked_fraction"]  # a given target's membership is unknown
    a = pq.read_table(run / "scores.parquet").to_pandas().drop(columns="member")
    b = pq.read_table(reuse / "scores.parquet").to_pandas().drop(columns="member")
    a = a[a.task_id.isin(set(b.task_id))]
    assert len(b) == len(a) > 0
    key = ["detector", "task_id"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    assert a[key].equals(b[key])
    # the same model and card: the same scores, up to float32 rounding of another batch size; a
    # learned detector's own training tasks are NaN (cross-fitting) in both
    np.testing.assert_allclose(a["score"].to_numpy(), b["score"].to_numpy(), rtol=1e-6, atol=1e-6)
