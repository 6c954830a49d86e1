"""ClassEval: task_id, skeleton, solution_code, test (unittest classes), class_name, test_classes."""

from __future__ import annotations

from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.prompts import as_comment
from leakray.data.tasks import make_task


def read_classeval(path: str | Path, benchmark: str = "classeval") -> list[dict]:
    path = Path(path)
    tasks = []
    for row, rec in iter_records(path):
        task_id = require(rec, "task_id", path=path, row=row)
        skeleton = require(rec, "skeleton", path=path, row=row)
        solution = require(rec, "solution_code", path=path, row=row)
        test = require(rec, "test", path=path, row=row)
        # the skeleton is complete code with stubbed methods, not a prefix: it becomes the docstring
        prompt = as_comment("Implement this class:\n\n" + skeleton, "python")
        tasks.append(make_task(
            benchmark=benchmark, task_id=task_id, language="python", prompt=prompt,
            reference=prompt + solution, tests=test, runner="unittest",
            entry_point=rec.get("class_name") or "",
            meta={"skeleton": skeleton, "test_classes": rec.get("test_classes") or []}, path=path, row=row,
        ))
    return tasks
