"""MBPP (upstream mbpp.jsonl): prompt = the task text plus its tests, as MBPP's README describes."""

from __future__ import annotations

import re
from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.tasks import make_task
from leakray.errors import BadInput

_CALL = re.compile(r"assert\s+(?:not\s+)?\(?\s*(?:set\(|math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(")


def mbpp_prompt(text: str, tests: list[str]) -> str:
    """A docstring the model continues with code; a valid Python prefix."""
    body = text.strip() + "\nYour code should pass these tests:\n" + "\n".join(tests)
    return '"""\n' + body.replace('"""', "'''") + '\n"""\n'


def read_mbpp(path: str | Path, benchmark: str = "mbpp") -> list[dict]:
    path = Path(path)
    tasks = []
    for row, rec in iter_records(path):
        task_id = require(rec, "task_id", path=path, row=row, types=(int, str))
        text = require(rec, "text", path=path, row=row)
        code = require(rec, "code", path=path, row=row)
        test_list = require(rec, "test_list", path=path, row=row, types=(list,))
        if not all(isinstance(t, str) for t in test_list):
            raise BadInput("every test must be a string", path=str(path), row=row, field="test_list")
        setup = rec.get("test_setup_code") or ""
        challenge = rec.get("challenge_test_list") or []
        match = _CALL.search(test_list[0])
        tasks.append(make_task(
            benchmark=benchmark, task_id=f"MBPP/{task_id}", language="python",
            prompt=mbpp_prompt(text, test_list),
            reference=code.replace("\r\n", "\n"),
            tests=(setup + "\n" if setup else "") + "\n".join(test_list) + "\n",
            runner="python", entry_point=match.group(1) if match else "",
            meta={"challenge_test_list": challenge}, path=path, row=row,
        ))
    return tasks
