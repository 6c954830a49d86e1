"""EvoCodeBench as CGMIA used it: namespace, prompt, solution; no tests, so the pass feature is absent."""

from __future__ import annotations

from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.prompts import as_comment
from leakray.data.tasks import make_task


def read_evocodebench(path: str | Path, benchmark: str = "evocodebench") -> list[dict]:
    path = Path(path)
    tasks = []
    for row, rec in iter_records(path):
        namespace = require(rec, "namespace", path=path, row=row)
        prompt = require(rec, "prompt", path=path, row=row)
        solution = require(rec, "solution", path=path, row=row)
        # a prompt that is not already the solution's code prefix becomes a docstring in front of it
        code_prompt = prompt if solution.startswith(prompt) else as_comment(prompt, "python")
        reference = solution if solution.startswith(prompt) else code_prompt + solution
        tasks.append(make_task(
            benchmark=benchmark, task_id=namespace, language="python", prompt=code_prompt,
            reference=reference, tests="", runner="python", entry_point=namespace.rsplit(".", 1)[-1],
            meta={"has_tests": False, "nl_prompt": prompt}, path=path, row=row,
        ))
    return tasks
