"""HumanEval-X (CodeGeeX): `task_id` ("Python/0", "Java/0"), prompt, canonical_solution, test,
declaration, example_test. Java tests are a `Main` class; Python tests already call `check`."""

from __future__ import annotations

import re
from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.tasks import make_task
from leakray.errors import BadInput

LANGS = {"python": "python", "java": "java"}
_PY_DEF = re.compile(r"^def\s+(\w+)\s*\(", re.M)
_JAVA_METHOD = re.compile(r"\bpublic\s+(?:static\s+)?[\w<>\[\], ?]+\s+(\w+)\s*\(")


def read_humaneval_x(path: str | Path, benchmark: str | None = None) -> list[dict]:
    path = Path(path)
    tasks = []
    for row, rec in iter_records(path):
        task_id = require(rec, "task_id", path=path, row=row)
        language = LANGS.get(task_id.split("/", 1)[0].lower())
        if language is None:
            raise BadInput(f"unsupported language in task_id {task_id!r} (python and java are)",
                           path=str(path), row=row, field="task_id")
        prompt = require(rec, "prompt", path=path, row=row)
        solution = require(rec, "canonical_solution", path=path, row=row)
        test = require(rec, "test", path=path, row=row)
        declaration = rec.get("declaration") or prompt
        if language == "python":
            defs = _PY_DEF.findall(declaration)
            entry = defs[-1] if defs else ""
            if entry and not re.search(r"^check\(", test, re.M):
                test = f"{test}\ncheck({entry})\n"
        else:
            methods = _JAVA_METHOD.findall(declaration)
            entry = methods[-1] if methods else ""
        tasks.append(make_task(
            benchmark=benchmark or f"humaneval-x-{language}", task_id=task_id, language=language,
            prompt=prompt, reference=prompt + solution, tests=test,
            runner="python" if language == "python" else "java-main", entry_point=entry,
            meta={"example_test": rec.get("example_test", "")}, path=path, row=row,
        ))
    return tasks
