"""AdvPrompt's proven variants, kept per task across runs ($LEAKRAY_CACHE/proofs).

A task's variants and their sandbox verdicts depend on the task's text, the perturbation seed,
the sandbox's limits and the code that perturbs and proves, never on a model. A sweep over
models x benchmarks, a re-audit with a card, or the demo's second run would otherwise prove the
same programs again (about a minute per 164 tasks on two cores). Keyed by all of those, one small
JSON file per task, written atomically: a killed run leaves whole entries or none; a key never
changes meaning, so an entry is never rewritten, only added. Only a task whose every variant was
kept (or not applicable) is stored: a pass is proven by the harness, but a failure may be a
timeout on a busy machine, and is tried again next run. The code is keyed by the bytes of
the modules that perturb and prove (not the commit): an unrelated change keeps the cache."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pyarrow as pa

from leakray.perturb.keep import BASELINE_FAILED, FAILED
from leakray.runs import cache_root, content_hash, write_json_atomic
from leakray.schema import C, T

FOLDER = "proofs"
COLUMNS = (C.ADV_PROMPTS, C.ADV_KIND, "check")
PACKAGE = Path(__file__).resolve().parent.parent
# what makes a variant and decides whether it is kept: the perturbations, the sandbox and its
# harness, the proof step
CODE = ("perturb", "sandbox", "stages/prove.py", "schema.py")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    h = hashlib.sha256()
    for part in CODE:
        root = PACKAGE / part
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def proof_key(task: dict, settings: dict) -> str:
    """The entry of ``task`` under ``settings`` (seed, limits, isolation) and this code."""
    return content_hash({k: task.get(k) for k in T.ALL}, settings, code_digest(), length=32)


def _path(root: Path, key: str) -> Path:
    return root / FOLDER / key[:2] / f"{key}.json"


def split_cached(tasks: list[dict], settings: dict, root: Path | None = None) -> tuple[list[dict], list[dict]]:
    """(rows found in the cache, tasks still to prove); a row is one ``prove_batch`` output row."""
    root = root or cache_root()
    found, todo = [], []
    for task in tasks:
        path = _path(root, proof_key(task, settings))
        try:
            row = json.loads(path.read_text())
        except (OSError, ValueError):  # absent, or unreadable: proved again, then rewritten whole
            todo.append(task)
            continue
        found.append({C.TASK_ID: task[T.TASK_ID], **{k: row[k] for k in COLUMNS}})
    return found, todo


def store(tasks: list[dict], proven: pa.Table, settings: dict, root: Path | None = None) -> int:
    """Add the rows of ``proven`` (one per task id) whose variants all held to the cache; returns
    how many were written."""
    root = root or cache_root()
    by_id = {t[T.TASK_ID]: t for t in tasks}
    n = 0
    for row in proven.to_pylist():
        task = by_id.get(row[C.TASK_ID])
        if task is None or any(item.rsplit("|", 1)[-1] in (FAILED, BASELINE_FAILED) for item in row["check"]):
            continue
        path = _path(root, proof_key(task, settings))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {k: row[k] for k in COLUMNS})
        n += 1
    return n
