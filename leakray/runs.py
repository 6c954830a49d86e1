"""Run directories keyed by a content hash, and per-stage completion markers.

A stage's outputs live in ``<run>/<stage>/``; it is done when ``_DONE.json``
exists there (written last, atomically), so a killed run resumes at the first
stage without a marker and never writes a finished stage twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

MARKER = "_DONE.json"


def content_hash(*parts: Any, length: int = 12) -> str:
    """Stable hash of JSON-able parts (configs, file digests); order of dict keys does not matter."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    """Where reusable artifacts (base models, tokenizers) live across runs."""
    root = Path(os.environ.get("LEAKRAY_CACHE", Path.home() / ".cache" / "leakray"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


class Stage:
    """One stage's directory: ``done`` says whether it finished, ``finish`` marks it."""

    def __init__(self, run_dir: Path, name: str):
        self.name = name
        self.dir = Path(run_dir) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()

    @property
    def marker(self) -> Path:
        return self.dir / MARKER

    @property
    def done(self) -> bool:
        return self.marker.exists()

    def info(self) -> dict:
        return json.loads(self.marker.read_text()) if self.done else {}

    def start(self) -> "Stage":
        self._t0 = time.perf_counter()
        return self

    def finish(self, **stats: Any) -> dict:
        info = {"stage": self.name, "seconds": round(time.perf_counter() - self._t0, 2), **stats}
        write_json_atomic(self.marker, info)
        return info
