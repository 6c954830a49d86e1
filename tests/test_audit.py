"""`leakray audit`: calibration and inflation on fixed synthetic inputs, a detector card's
save/reuse, and the audit's flags and refusals (the audit end to end is tests/test_audit_e2e.py)."""

import json

import numpy as np
import pyarrow as pa
import pytest
from cgmia_data import synthetic_collection

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
    # probabilities on the bins' edges (an isotonic calibrator's steps often are): one count per point
    on_edges = reliability([0, 1, 0, 1, 1], [0.1, 0.15, 0.5, 0.55, 1.0])
    assert len(on_edges["count"]) == len(on_edges["mean_predicted"]) == len(on_edges["fraction_positive"])
    assert on_edges["count"] == [1, 1, 1, 1, 1] and on_edges["mean_predicted"][:2] == pytest.approx([0.1, 0.15])
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
    from leakray.progress import PROGRESS_FILE, JobTally

    # counted as the card stage counts its detector jobs: the count lies in the card's directory
    # while it is built, and is not one of the card's files (the stage removes it when it ends)
    (tmp_path / "card").mkdir()  # the stage's directory, there before its work starts
    tally = JobTally(tmp_path / "card" / PROGRESS_FILE)
    card = build_card(shadow, cfg, tmp_path / "card", storage=tmp_path / "ray", meta={"benchmark": {"name": "x"}},
                      tally=tally)
    assert set(card.names) == {"cgmia", "ref_loss"} and card.meta["n_val"] == 40
    # two jobs: ref_loss, and cgmia's seeds in one (not detect.parallel: no Ray task per seed)
    assert tally.done == tally.total == 2 and PROGRESS_FILE not in card.meta["files"]
    assert {"fit", "threshold", "score", "metrics", "calibrate"} <= set(card.stage_parts["part_seconds"])
    (tmp_path / "card" / PROGRESS_FILE).unlink()
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
    args = build_parser().parse_args(["audit", "--control", "fresh=/d/new.jsonl"])
    assert audit_overrides(args) == ["audit.control=fresh=/d/new.jsonl"]


def test_audit_refuses_bad_input(tmp_path):
    from leakray.cli import main

    assert main(["audit", "--card", str(tmp_path)]) == 2  # not a card
    assert main(["audit", "--set", "audit.member_fraction=1.5"]) == 2
    assert main(["audit", "--set", "audit.detector=cgmai"]) == 2
    assert main(["audit", "--control", f"fresh={tmp_path / 'missing.jsonl'}", "--output", str(tmp_path)]) == 2
    junk = tmp_path / "junk"  # a corpus of which nothing can be screened: refused before the fine-tunes
    junk.mkdir()
    (junk / "empty.py").write_text("")
    assert main(["audit", "--corpus", str(junk), "--output", str(tmp_path)]) == 2
    assert main(["audit", "--corpus", str(tmp_path / "missing" / "**"), "--output", str(tmp_path)]) == 2
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("audit-*"))  # refused before any work


def test_a_card_made_with_other_advprompt_kinds_is_named_a_mismatch():
    """AdvPrompt's features of a kind not completed are missing slots: a card and an audit that
    complete other kinds see other feature distributions. A card from before the setting was
    recorded was made with every kind."""
    from types import SimpleNamespace

    from leakray.config import AuditConfig, load_config
    from leakray.protocols.audit import card_mismatches, collection_settings, target_reference

    every = load_config([], [], AuditConfig)
    fewer = load_config([], ["columns.advprompt_kinds=[IDP]"], AuditConfig)

    def card(cfg, drop=()):
        settings = {k: v for k, v in collection_settings(cfg, target_reference(cfg)).items() if k not in drop}
        return SimpleNamespace(meta={"benchmark": {"name": cfg.benchmark.name}, "collection": settings})

    assert card_mismatches(card(every), every, []) == []
    assert card_mismatches(card(every, drop=("advprompt_kinds",)), every, []) == []  # recorded before the setting
    (line,) = card_mismatches(card(every, drop=("advprompt_kinds",)), fewer, [])
    assert "collection settings differ" in line and "advprompt_kinds" in line
    (line,) = card_mismatches(card(fewer), every, [])
    assert "advprompt_kinds" in line


def test_an_endpoint_audit_samples_the_shadow_here_and_the_target_there(tmp_path, monkeypatch):
    """`sample.backend=openai` serves the model under audit; the shadow is a model the audit made,
    so its collection samples it with the HF backend (before, it went to the endpoint under its
    local path as the model's name: refused there, or, with `sample.endpoint_model` set, the
    served target's samples collected as the shadow's). Both with the same sampling settings."""
    from types import SimpleNamespace

    from leakray.config import AuditConfig, load_config
    from leakray.data.humaneval import read_humaneval
    from leakray.protocols import collection
    from leakray.protocols.audit import audit_stages

    cfg = load_config([], ["sample.backend=openai", "sample.endpoint_url=http://host:8000/v1", "audit.target=served",
                           "columns.advprompt=false", "columns.reference_model=null", "sample.k=3"], AuditConfig)
    seen = {}
    monkeypatch.setattr(collection, "collect_to",
                        lambda table, path, ccfg, out: seen.setdefault(out.name, (path, ccfg.sample)) and {})
    runner = SimpleNamespace(info={"base": {"path": "/b"}, "shadow": {"model": str(tmp_path / "shadow")}},
                             dir=lambda name: tmp_path / name, run_dir=tmp_path)
    tasks = read_humaneval()[:4]
    (runner.dir("split")).mkdir()
    (runner.dir("split") / "split.json").write_text(json.dumps({"shadow_members": [tasks[0]["task_id"]],
                                                               "planted_members": None}))
    stages = {s.name: s for s in audit_stages(cfg, tasks, runner, "bwrap", None, False) if hasattr(s, "run")}
    for name in ("collect_shadow", "collect_target"):
        (tmp_path / name).mkdir()
        stages[name].run(tmp_path / name)
    (shadow_path, shadow), (target_path, target) = seen["collect_shadow"], seen["collect_target"]
    assert shadow_path == str(tmp_path / "shadow") and shadow.backend == "hf"
    assert target_path == "served" and target.backend == "openai" and target.endpoint_url == "http://host:8000/v1"
    assert shadow.k == target.k == 3 and shadow.max_new_tokens == target.max_new_tokens


def test_an_endpoint_that_does_not_answer_stops_the_audit_before_any_stage(tmp_path, capsys):
    """A wrong URL (nothing listens there): one line and exit code 2 in seconds, before the shadow's
    fine-tune and card, which would otherwise run for minutes before the target's collection found it."""
    import socket

    from leakray.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "runs"
    assert main(["audit", "--quick", "--target", "served", "--set", "sample.backend=openai",
                 "--set", f"sample.endpoint_url=http://127.0.0.1:{port}/v1", "--set", "sample.max_retries=0",
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"127.0.0.1:{port}" in err and "did not answer" in err, err
    assert not list(out.glob("audit-*/*/_DONE.json"))  # no stage ran
