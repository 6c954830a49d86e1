"""A detector card: everything an audit needs to score a model without training again.

A directory holding the fitted detectors (each saved by ``Detector.save``: weights, frozen
projections, scalers), their scores on held-out shadow rows (``val_scores.parquet``: the
rows calibration, curves and the prevalence correction are measured on), one calibrator
per detector, the validation metrics, and ``card.json`` (written last: it marks the card
complete) with the shadow's configuration and base model. ``leakray card build`` writes
one; ``leakray audit --card DIR`` reuses it and states its id.

A card is shared between users, so it is data, never code: every file is JSON, parquet,
numpy (read without pickles), safetensors or skops (see ``leakray.detect.datafiles``), and
``card.json`` records each file's sha256 (``files``: relative path -> hash; part of the
card id). Opening a card checks both: a file whose extension can hold code, a file whose
bytes differ from its recorded hash, a recorded file that is gone, or an unrecorded file
among the detectors is refused with one line naming it, before anything is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.detect.datafiles import DATA_SUFFIXES
from leakray.errors import BadInput
from leakray.evaluate.calibration import Calibrator
from leakray.progress import PROGRESS_FILE
from leakray.runs import MARKER, content_hash, file_digest, write_json_atomic
from leakray.schema import S

CARD_FILE = "card.json"
VAL_SCORES = "val_scores.parquet"
# the detectors that learn nothing, scored on the fit half too: nothing chose anything on those rows
# for them, so the card route's member/non-member distributions may use every shadow task
FIT_SCORES = "fit_scores.parquet"
DETECTORS_DIR = "detectors"
# 4: the sampled next-token probes count a draw only when it writes the next pre-token whole
# (`features.probes.next_agreement`): their statistics, and the composites fitted on them, moved;
# 3: CGMIA's, AdvPrompt-MIA's and the classic MLP's scores, cuts and calibrators are member
# log-odds (2: their probabilities, saturated at 1.0; a version-2 card's cuts mean nothing on them);
# 2: plain-data detector files with recorded hashes (1: pickles)
VERSION = 4


def saved_name(name: str, seed: int) -> str:
    """The directory evaluate_detectors saves a fitted detector under."""
    return name if seed == S.BASELINE_SEED else f"{name}-seed{seed}"


class DetectorCard:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_path = self.path / CARD_FILE
        if not meta_path.exists():
            raise BadInput("not a detector card (no card.json; was `leakray card build` interrupted?)",
                           path=str(meta_path))
        self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        if self.meta.get("version") != VERSION:
            raise BadInput(f"detector card version {self.meta.get('version')} is not {VERSION}: made by an "
                           "earlier leakray (some of its detectors' scores were on another scale); build the card "
                           "again (`leakray card build`, or the audit with --no-reuse)", path=str(meta_path))
        check_files(self.path, self.meta.get("files"))

    @property
    def id(self) -> str:
        return self.meta["card_id"]

    @property
    def names(self) -> list[str]:
        return list(self.meta["detectors"])

    def calibrator(self, name: str) -> Calibrator:
        return Calibrator.from_dict(self.meta["detectors"][name]["calibration"])

    def val_scores(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(member, score) of ``name`` on the held-out shadow rows, in task order."""
        seed = self.meta["detectors"][name]["seed"]
        t = pq.read_table(self.path / VAL_SCORES).to_pandas()
        t = t[(t[S.DETECTOR] == name) & (t[S.SEED] == seed)].sort_values(S.TASK_ID)
        return t[S.MEMBER].to_numpy(np.int64), t[S.SCORE].to_numpy(np.float64)

    def shadow_scores(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(member, score) on every shadow row nothing was fitted on for ``name``: the held-out rows,
        plus the fit half for a detector that learns nothing (when the card stored them)."""
        y, s = self.val_scores(name)
        path = self.path / FIT_SCORES
        if self.meta["detectors"][name]["spec"].get("learns") or not path.exists():
            return y, s
        t = pq.read_table(path).to_pandas()
        t = t[t[S.DETECTOR] == name]
        return (np.concatenate([y, t[S.MEMBER].to_numpy(np.int64)]),
                np.concatenate([s, t[S.SCORE].to_numpy(np.float64)]))

    def load_detector(self, name: str):
        from leakray.detect import registry

        entry = self.meta["detectors"][name]
        return registry.load(self.path / DETECTORS_DIR / saved_name(name, entry["seed"]))

    def score(self, table: pa.Table, names: list[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Every card detector's scores on ``table``; the ones its columns cannot feed are
        returned in ``skipped`` with the reason (a black-box target has no logprobs)."""
        from leakray.detect import registry
        from leakray.detect.base import missing_input

        scores, skipped = {}, {}
        for name in self.names if names is None else names:
            why = missing_input(table, registry.spec(name).columns)
            if why:
                skipped[name] = why
                continue
            det = self.load_detector(name)  # a bad card file is refused, not passed off as unusable input
            try:
                scores[name] = np.asarray(det.score(table), dtype=np.float64)
            except BadInput as exc:
                skipped[name] = f"input unusable: {exc}"
        return scores, skipped


def write_card(out: Path, *, result: dict, val_table: pa.Table, calibration: dict[str, dict],
               calibration_quality: dict[str, dict], suspect_cuts: dict[str, dict], meta: dict) -> DetectorCard:
    """Finish a card whose detectors ``evaluate_detectors(save_dir=out/detectors)`` saved."""
    pq.write_table(result["scores"], out / VAL_SCORES)
    first_seed = result["seeds"][0]
    detectors = {}
    for name, metrics in result["median"].items():
        learns = result["specs"][name]["learns"]
        detectors[name] = {
            "seed": first_seed if learns else S.BASELINE_SEED, "spec": result["specs"][name],
            "validation": metrics, "calibration": calibration[name], "calibration_quality": calibration_quality[name],
            "suspect_cut": suspect_cuts[name],
        }
    check_suffixes(out)
    body = {
        "version": VERSION, "files": card_files(out), "detectors": detectors, "skipped": result.get("skipped", {}),
        "n_val": int(val_table.num_rows), "val_task_ids": sorted(val_table.column(S.TASK_ID).to_pylist()),
        "threshold_rule": result["threshold_rule"], "seeds": result["seeds"], **meta,
    }
    body["card_id"] = content_hash(body)
    write_json_atomic(out / CARD_FILE, body)
    return DetectorCard(out)


def _card_paths(root: Path) -> list[Path]:
    """Every file of a card but card.json (and the stage marker and progress count of the run that
    built it)."""
    return sorted(p for p in root.rglob("*") if not p.is_dir() and p.relative_to(root).as_posix()
                  not in (CARD_FILE, MARKER) and not p.name.startswith((CARD_FILE + ".tmp", PROGRESS_FILE)))


def check_suffixes(root: Path) -> None:
    """Refuse a card holding a file whose format can carry code (a pickle, ...)."""
    for p in _card_paths(root):
        if p.is_symlink() or p.suffix.lower() not in DATA_SUFFIXES:
            what = "is a symbolic link" if p.is_symlink() else f"has extension {p.suffix or '(none)'!r}"
            raise BadInput(f"card file {what}: a card holds data only ({', '.join(DATA_SUFFIXES)})",
                           path=str(p))


def card_files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every card file (written into card.json)."""
    return {p.relative_to(root).as_posix(): file_digest(p) for p in _card_paths(root)}


def check_files(root: Path, files: dict[str, str] | None) -> None:
    """The card's files are the ones card.json recorded, byte for byte, and all plain data."""
    if not isinstance(files, dict) or not files:
        raise BadInput("detector card records no file hashes", path=str(root / CARD_FILE))
    check_suffixes(root)
    for rel, digest in files.items():
        p = root / rel
        if not p.resolve().is_relative_to(root.resolve()):
            raise BadInput("card file lies outside the card", path=str(p))
        if Path(rel).suffix.lower() not in DATA_SUFFIXES:
            raise BadInput(f"card file has extension {Path(rel).suffix or '(none)'!r}: a card holds data only",
                           path=str(p))
        if not p.is_file():
            raise BadInput("card file recorded in card.json is missing", path=str(p))
        if file_digest(p) != digest:
            raise BadInput("card file differs from the sha256 recorded in card.json", path=str(p))
    for p in _card_paths(root):
        rel = p.relative_to(root).as_posix()
        if rel not in files and rel.startswith(DETECTORS_DIR + "/"):
            raise BadInput("card file is not recorded in card.json", path=str(p))
