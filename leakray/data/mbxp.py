"""MBXP (mxeval): task_id ("MBJP/1", "MBPP/1"), language, prompt, canonical_solution, test,
entry_point, description. Rows without a canonical solution (92 in MBJP) cannot be tasks."""

from __future__ import annotations

import re
from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.prompts import report_skipped
from leakray.data.tasks import make_task
from leakray.errors import BadInput


def read_mbxp(path: str | Path, benchmark: str | None = None) -> list[dict]:
    path = Path(path)
    tasks, skipped = [], []
    for row, rec in iter_records(path):
        task_id = require(rec, "task_id", path=path, row=row)
        language = require(rec, "language", path=path, row=row).lower()
        if language not in ("python", "java"):
            raise BadInput(f"unsupported language {language!r} (python and java are)", path=str(path),
                           row=row, field="language")
        if not (rec.get("canonical_solution") or "").strip():
            skipped.append(task_id)
            continue
        prompt = require(rec, "prompt", path=path, row=row)
        test = require(rec, "test", path=path, row=row)
        entry = rec.get("entry_point") or ""
        if language == "python" and entry and "def check(" in test and not re.search(r"^check\(", test, re.M):
            test = f"{test}\ncheck({entry})\n"
        tasks.append(make_task(
            benchmark=benchmark or f"mbxp-{language}", task_id=task_id, language=language, prompt=prompt,
            reference=prompt + rec["canonical_solution"], tests=test,
            runner="python" if language == "python" else "java-main", entry_point=entry,
            meta={"description": rec.get("description", "")}, path=path, row=row,
        ))
    report_skipped(path, "without canonical_solution", skipped)
    return tasks
