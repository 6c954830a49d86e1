"""A detector card is data, never code: a card built from fitted detectors reloads and scores
the same; a card holding a pickle (in place of a detector file, beside it, or with card.json
rewritten to match it) is refused with one line naming the file, and the pickle never runs;
a changed byte in a weights file is refused; every learned detector saves plain data only."""

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from cgmia_data import rich_collection

from leakray.detect import registry
from leakray.detect.card import CARD_FILE, DETECTORS_DIR, DetectorCard, card_files, write_card
from leakray.detect.datafiles import DATA_SUFFIXES
from leakray.errors import BadInput
from leakray.runs import file_digest

torch.set_num_threads(1)
DETECTORS = ["codemi", "ref_loss", "cnn"]  # skops (scikit-learn), none, safetensors (torch)
PARAMS = {"codemi": {"max_iter": 200}, "cnn": {"epochs": 1}}


class Payload:
    """Unpickling this writes ``marker``: what a tampered card would do on a pickle-loading reader."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (Path(self.marker), "ran")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from leakray.evaluate.calibration import fit_calibrator
    from leakray.protocols.detectors import evaluate_detectors
    from leakray.schema import S

    out = tmp_path_factory.mktemp("card") / "card"
    fit, val = rich_collection(n=60, seed=1, prefix="f"), rich_collection(n=40, seed=2, prefix="v")
    result = evaluate_detectors(fit, val, seeds=(0,), detectors=DETECTORS, detector_params=PARAMS,
                                use_ray_train=False, save_dir=out / DETECTORS_DIR, bootstrap=0,
                                trace_memory=False)
    assert not result["skipped"], result["skipped"]
    scores = result["scores"].to_pandas()
    calibration, cuts = {}, {}
    for name in result["median"]:
        rows = scores[scores[S.DETECTOR] == name]
        calibration[name] = fit_calibrator(rows[S.MEMBER].to_numpy(np.int64), rows[S.SCORE].to_numpy()).to_dict()
        cuts[name] = {"cut": 0.0}
    card = write_card(out, result=result, val_table=val, calibration=calibration,
                      calibration_quality={n: {} for n in calibration}, suspect_cuts=cuts,
                      meta={"benchmark": {"name": "synthetic"}})
    return card, rich_collection(n=30, seed=3, prefix="t")


@pytest.fixture
def tampered(built, tmp_path):
    """A fresh copy of the card to tamper with."""
    card, _ = built
    return Path(shutil.copytree(card.path, tmp_path / "card"))


def _model_file(root: Path, name: str, filename: str) -> Path:
    found = sorted((root / DETECTORS_DIR).glob(f"{name}*/{filename}"))
    assert len(found) == 1, found
    return found[0]


def _refused(root: Path, match: str, marker: Path | None = None) -> str:
    with pytest.raises(BadInput) as err:
        DetectorCard(root).score(rich_collection(n=10, seed=9, prefix="x"))
    line = str(err.value)
    assert "\n" not in line and match in line, line
    if marker is not None:
        assert not marker.exists(), "the pickle ran"
    return line


def _rewrite_hashes(root: Path) -> None:
    """What an attacker who also edits card.json does: record the tampered files' hashes."""
    meta = json.loads((root / CARD_FILE).read_text())
    meta["files"] = card_files(root)
    (root / CARD_FILE).write_text(json.dumps(meta))


def test_payload_is_live(tmp_path):
    """The control: a reader that unpickles the payload does write its marker."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
    assert (tmp_path / "ran").read_text() == "ran"


def test_card_records_hashes_and_reloads_to_the_same_scores(built):
    card, target = built
    files = card.meta["files"]
    assert all(Path(f).suffix in DATA_SUFFIXES for f in files), files
    assert "val_scores.parquet" in files and any(f.endswith("/model.skops") for f in files)
    assert any(f.endswith("/weights.safetensors") for f in files)
    assert files == card_files(card.path)
    assert all(files[f] == file_digest(card.path / f) for f in files)
    first, skipped = card.score(target)
    again, _ = DetectorCard(card.path).score(target)  # a fresh load from disk
    assert not skipped and set(first) == set(DETECTORS)
    for name in DETECTORS:
        assert np.array_equal(first[name], again[name]) and np.isfinite(first[name]).all()
        assert len(np.unique(first[name])) > 1, name  # a real model, not a constant


def test_hashes_are_part_of_the_card_id(built):
    from leakray.runs import content_hash

    card, _ = built
    body = {k: v for k, v in card.meta.items() if k != "card_id"}
    assert content_hash(body) == card.id
    body["files"] = {**body["files"], "val_scores.parquet": "0" * 64}
    assert content_hash(body) != card.id


def test_pickle_beside_the_model_is_refused_and_never_runs(tampered, tmp_path):
    marker = tmp_path / "marker"
    skops = _model_file(tampered, "codemi", "model.skops")
    skops.unlink()
    (skops.parent / "model.joblib").write_bytes(pickle.dumps(Payload(marker)))
    line = _refused(tampered, "has extension '.joblib'", marker)
    assert "model.joblib" in line


def test_pickle_in_place_of_the_model_is_refused_and_never_runs(tampered, tmp_path):
    marker = tmp_path / "marker"
    skops = _model_file(tampered, "codemi", "model.skops")
    skops.write_bytes(pickle.dumps(Payload(marker)))
    line = _refused(tampered, "differs from the sha256 recorded", marker)
    assert "model.skops" in line
    # card.json rewritten to match: the hash check passes, the file format still cannot run code
    _rewrite_hashes(tampered)
    card = DetectorCard(tampered)
    with pytest.raises(BadInput, match="not a skops model file") as err:
        card.load_detector("codemi")
    assert "model.skops" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(BadInput, match="not a skops model file"):  # scoring refuses too, not "input unusable"
        card.score(rich_collection(n=10, seed=9, prefix="x"))
    assert not marker.exists()


def test_recorded_pickle_is_refused(tampered, tmp_path):
    marker = tmp_path / "marker"
    weights = _model_file(tampered, "cnn", "weights.safetensors")
    weights.unlink()
    (weights.parent / "weights.pt").write_bytes(pickle.dumps(Payload(marker)))
    _rewrite_hashes(tampered)  # recorded with its true hash: still refused for what it is
    line = _refused(tampered, "has extension '.pt'", marker)
    assert "weights.pt" in line


def test_skops_file_naming_an_untrusted_type_is_refused(tampered):
    """skops can name any callable; a model holding os.system (called on scoring) is refused at load."""
    import skops.io as sio
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    sio.dump(make_pipeline(FunctionTransformer(func=os.system)), _model_file(tampered, "codemi", "model.skops"))
    _rewrite_hashes(tampered)
    with pytest.raises(BadInput, match="types leakray does not load: .*system") as err:
        DetectorCard(tampered).load_detector("codemi")
    assert "\n" not in str(err.value)


def test_changed_byte_in_weights_is_refused(tampered):
    weights = _model_file(tampered, "cnn", "weights.safetensors")
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    line = _refused(tampered, "differs from the sha256 recorded in card.json")
    assert str(weights) in line


def test_missing_and_unrecorded_files_are_refused(tampered):
    extra = _model_file(tampered, "codemi", "model.skops").parent / "extra.json"
    extra.write_text("{}")
    assert "extra.json" in _refused(tampered, "not recorded in card.json")
    extra.unlink()
    (tampered / "val_scores.parquet").unlink()
    assert "val_scores.parquet" in _refused(tampered, "recorded in card.json is missing")


def test_card_without_hashes_is_refused(tampered):
    meta = json.loads((tampered / CARD_FILE).read_text())
    (tampered / CARD_FILE).write_text(json.dumps({**meta, "files": {}}))
    _refused(tampered, "records no file hashes")
    for old in (1, 2):  # pickles; then learned detectors' probabilities (their scores are log-odds since)
        (tampered / CARD_FILE).write_text(json.dumps({**meta, "version": old}))
        _refused(tampered, "build the card again")


def test_stage_marker_beside_the_card_is_tolerated(tampered):
    from leakray.runs import MARKER

    (tampered / MARKER).write_text("{}")
    assert DetectorCard(tampered).names


@pytest.mark.parametrize("kind,point", [("lr", {"C": 1.0}), ("rf", {"n_estimators": 5, "max_depth": 3}),
                                        ("svm", {"C": 1.0, "kernel": "rbf"}), ("nb", {"var_smoothing": 1e-9}),
                                        ("dt", {"max_depth": 3, "min_samples_leaf": 1}),
                                        ("mlp", {"hidden_layer_sizes": [8], "alpha": 1e-4})])
def test_classic_models_save_as_skops_and_score_the_same(kind, point, tmp_path):
    """Every classic model (trees and the MLP's optimiser included) round-trips through skops
    with the trusted-type list; fitted on one grid point directly (no Ray Tune)."""
    from leakray.detect.base import labels, task_keys
    from leakray.detect.expert_ml import expert_means

    sh, tg = rich_collection(n=60, seed=1), rich_collection(n=30, seed=2, prefix="u")
    data = {"x": expert_means(sh), "y": labels(sh), "keys": task_keys(sh), "val_share": 0.4}
    det = registry.make(kind)
    det._fit_chosen(data, 0, {"chosen": {"kind": kind, **point}, "trials": [{"seconds": 0.0}], "val_auc": 0.5})
    saved = det.save(tmp_path / kind)
    assert sorted(p.name for p in saved.iterdir()) == ["detector.json", "model.skops"]
    np.testing.assert_array_equal(registry.load(saved).score(tg), det.score(tg))


@pytest.mark.parametrize("name,params", [("gotcha", {"hidden": [8], "max_iter": 20}),
                                         ("leakray_combined", {}),
                                         ("cgmia", {"config": {"epochs": 1, "expert_proj_dim": 16, "hidden": [8]}})])
def test_learned_detectors_save_plain_data_only(name, params, tmp_path):
    sh, tg = rich_collection(n=40, seed=1), rich_collection(n=20, seed=2, prefix="u")
    det = registry.make(name, params).fit(sh, seed=1)
    saved = det.save(tmp_path / name)
    suffixes = {p.suffix for p in saved.rglob("*") if p.is_file()}
    assert suffixes <= set(DATA_SUFFIXES), suffixes
    np.testing.assert_array_equal(registry.load(saved).score(tg), det.score(tg))
