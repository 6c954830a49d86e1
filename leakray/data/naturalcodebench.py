"""NaturalCodeBench: _id, prompt (natural language), reference_solution (in a Markdown fence),
testcases (a pytest module for Python, a JUnit 5 class for Java), setup_code."""

from __future__ import annotations

import re
from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.prompts import as_comment
from leakray.data.tasks import make_task
from leakray.errors import BadInput

_FENCE = re.compile(r"```[ \t]*(\w*)[^\n]*\n(.*?)```", re.S)


def unfence(text: str) -> tuple[str, str]:
    """(language tag, code) of the first fenced block; ("", text) when there is none."""
    m = _FENCE.search(text)
    return (m.group(1).lower(), m.group(2)) if m else ("", text)


def _language(rec: dict, tag: str, path: Path) -> str | None:
    for hint in (rec.get("language"), tag, path.name.lower()):
        if hint:
            hint = str(hint).lower()
            if "java" in hint:
                return "java"
            if "python" in hint or hint == "py":
                return "python"
    return None


def read_naturalcodebench(path: str | Path, benchmark: str | None = None) -> list[dict]:
    path = Path(path)
    tasks = []
    for row, rec in iter_records(path):
        nid = require(rec, "_id", path=path, row=row, types=(int, str))
        prompt = require(rec, "prompt", path=path, row=row)
        tag, code = unfence(require(rec, "reference_solution", path=path, row=row))
        tests = require(rec, "testcases", path=path, row=row)
        language = _language(rec, tag, path)
        if language is None:
            raise BadInput("cannot tell python from java (no fence tag, `language` or file name hint)",
                           path=str(path), row=row, field="reference_solution")
        setup = rec.get("setup_code") or ""
        if language == "python" and setup.strip():
            tests = setup.rstrip() + "\n\n" + tests  # runs at import, before the test classes
        tasks.append(make_task(
            benchmark=benchmark or f"naturalcodebench-{language}", task_id=str(nid), language=language,
            prompt=as_comment(prompt, language), reference=as_comment(prompt, language) + code.strip() + "\n",
            tests=tests, runner="pytest" if language == "python" else "junit5",
            meta={"nl_prompt": prompt, "setup_code": setup, "classification": rec.get("classification", "")},
            path=path, row=row,
        ))
    return tasks
