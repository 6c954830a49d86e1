"""A benchmark of your own, in leakray's task format: one record per task with the task table's
own fields (`leakray.schema.T`), so that a private or in-house benchmark needs no reader of its
own. JSONL(.gz), JSON or parquet, as every reader.

Required: ``task_id``, ``prompt`` (what the model is given: the program's beginning, a task in
words inside a docstring or comment) and ``reference`` (the complete
runnable solution, the prompt's code included; one that does not repeat the prompt follows it, as
MBPP's do). Optional: ``tests`` (harness-ready test code; without it every program is "no tests"
and the pass feature carries nothing), ``language`` (``python``, the default, or ``java``),
``runner`` (how ``tests`` run, `leakray.schema.X.RUNNERS`: ``python``, the default, runs them
after the program, plain ``assert``s; ``unittest``, ``pytest``; ``stdio``, a JSON object of equal
lists ``inputs`` and ``outputs``; for Java ``java-main``, the default, and ``junit5``), ``entry_point``, ``meta`` (a JSON object) and ``benchmark``
(the label; the command line's ``NAME=PATH`` gives it otherwise). Every row is refused with its
file, row and field when it breaks the schema."""

from __future__ import annotations

import json
from pathlib import Path

from leakray.data.io import iter_records
from leakray.data.tasks import make_task
from leakray.errors import BadInput
from leakray.schema import T

# the fields whose presence identifies the format (`data.registry.sniff_reader`)
SIGNATURE = (T.TASK_ID, T.PROMPT, T.REFERENCE)


def read_task_file(path: str | Path, benchmark: str | None = None) -> list[dict]:
    """Tasks from a file in leakray's task format (module doc); ``benchmark`` labels every task
    (else each record's own ``benchmark``, else the file's stem)."""
    path = Path(path)
    label = benchmark or path.name.split(".", 1)[0]
    tasks = []
    for row, rec in iter_records(path):
        missing = [f for f in SIGNATURE if f not in rec]
        if missing:
            raise BadInput(f"lacks {', '.join(missing)} (leakray's task format needs {', '.join(SIGNATURE)})",
                           path=str(path), row=row, field=missing[0])
        for field in T.ALL:
            if field != T.META and rec.get(field) is not None and not isinstance(rec[field], str):
                raise BadInput("not a string", path=str(path), row=row, field=field)
        meta = rec.get(T.META) or {}
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except json.JSONDecodeError as exc:
                raise BadInput(f"not a JSON object ({exc.msg})", path=str(path), row=row, field=T.META) from exc
        if not isinstance(meta, dict):
            raise BadInput("not a JSON object", path=str(path), row=row, field=T.META)
        tasks.append(make_task(
            benchmark=benchmark or rec.get(T.BENCHMARK) or label, task_id=rec[T.TASK_ID],
            language=rec.get(T.LANGUAGE) or "python", prompt=rec[T.PROMPT], reference=rec[T.REFERENCE],
            tests=rec.get(T.TESTS) or "", runner=rec.get(T.RUNNER) or None,
            entry_point=rec.get(T.ENTRY_POINT) or "", meta=meta, path=str(path), row=row))
    if not tasks:
        raise BadInput("file has no records", path=str(path))
    return tasks
