"""Benchmark names and paths -> task lists. Readers register here."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from leakray.errors import BadInput

# name -> reader(path or None) -> list[task dict]
READERS: dict[str, Callable[..., list[dict]]] = {}
# name -> default path (None: the reader knows where its data ships)
DEFAULT_PATHS: dict[str, str | None] = {}
# reader name -> fields whose presence in a record identifies the format (first match wins)
SIGNATURES: list[tuple[str, frozenset[str]]] = []


def register(name: str, reader: Callable[..., list[dict]], default_path: str | None = None,
             signature: tuple[str, ...] = ()) -> None:
    READERS[name] = reader
    DEFAULT_PATHS[name] = default_path
    if signature:
        SIGNATURES.append((name, frozenset(signature)))


def _builtin() -> None:
    from leakray.data.humaneval import read_humaneval
    from leakray.data.mbpp import read_mbpp

    register("humaneval", read_humaneval,
             signature=("task_id", "prompt", "canonical_solution", "test", "entry_point"))
    register("mbpp", read_mbpp, signature=("task_id", "text", "code", "test_list"))

    from leakray.data.apps import read_apps
    from leakray.data.classeval import read_classeval
    from leakray.data.evocodebench import read_evocodebench
    from leakray.data.humaneval_x import read_humaneval_x
    from leakray.data.mbxp import read_mbxp
    from leakray.data.naturalcodebench import read_naturalcodebench

    register("humaneval-x", read_humaneval_x,
             signature=("task_id", "prompt", "canonical_solution", "test", "declaration", "example_test"))
    register("mbxp", read_mbxp,
             signature=("task_id", "prompt", "canonical_solution", "test", "entry_point", "description", "language"))
    register("naturalcodebench", read_naturalcodebench, signature=("_id", "prompt", "reference_solution", "testcases"))
    register("evocodebench", read_evocodebench, signature=("namespace", "prompt", "solution"))
    register("classeval", read_classeval, signature=("task_id", "skeleton", "solution_code", "test", "class_name"))
    register("apps", read_apps, signature=("problem_id", "question", "solutions", "input_output"))

    from leakray.data.task_file import SIGNATURE, read_task_file

    # a benchmark of the user's own, in the task table's own fields (data/task_file.py)
    register(TASK_FORMAT, read_task_file, signature=SIGNATURE)


TASK_FORMAT = "tasks"  # the reader of leakray's own task format
TASK_FORMAT_FIELDS = "task_id, prompt, reference, optional tests, language, entry_point"
# a label of the user's own (`--benchmark NAME=PATH`): it names run directories and report rows
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


_builtin()


def unique_ids(tasks: list[dict], path) -> list[dict]:
    """``tasks``, refused when two share a task_id: every stage keys its rows by it, so the second
    would silently take the first's place (a benchmark of 9 records audited as 8)."""
    import json

    from leakray.schema import T

    first: dict[str, dict] = {}
    for task in tasks:
        seen = first.setdefault(task[T.TASK_ID], task)
        if seen is not task:
            rows = [json.loads(t[T.META]).get("source_row") for t in (seen, task)]
            raise BadInput(f"task_id {task[T.TASK_ID]!r} is in two records (rows {rows[0]} and {rows[1]}); "
                           "every task needs an id of its own", path=str(path) if path else None, field=T.TASK_ID)
    return tasks


def load_benchmark(spec: str, path: str | Path | None = None) -> list[dict]:
    """Load tasks by registered name (optionally with a path), e.g. 'humaneval' or 'mbpp' + path;
    a name of the user's own with a path is a label, the file's format sniffed (`load_benchmark_file`)."""
    if spec not in READERS:
        if path is not None:
            return load_benchmark_file(check_label(spec), path)
        raise BadInput(f"unknown benchmark {spec!r}; known: {sorted(READERS)}; a benchmark of your own: "
                       f"NAME=PATH (any of these formats, or leakray's task format: {TASK_FORMAT_FIELDS})")
    path = path or DEFAULT_PATHS.get(spec)
    return unique_ids(READERS[spec](path) if path else READERS[spec](), path)


def check_label(name: str) -> str:
    """A benchmark label of the user's own, refused unless it can name a directory and a report row."""
    if not _LABEL.fullmatch(name or ""):
        raise BadInput(f"benchmark label {name!r}: letters, digits, '.', '_' or '-', at most 64, "
                       "starting with a letter or digit", field="benchmark.name")
    return name


def sniff_reader(path: str | Path) -> str:
    """The registered reader whose signature fields the file's first record has."""
    from leakray.data.io import iter_records

    for _, rec in iter_records(path):
        keys = set(rec)
        for name, fields in sorted(SIGNATURES, key=lambda s: -len(s[1])):  # most specific first
            if fields <= keys:
                return name
        raise BadInput(f"no reader recognises fields {sorted(keys)} (leakray's own task format has "
                       f"{TASK_FORMAT_FIELDS})", path=str(path), row=1)
    raise BadInput("file has no records", path=str(path))


def load_benchmark_file(name: str, path: str | Path) -> list[dict]:
    """`NAME=PATH` on command lines: NAME is a reader if registered, else a label and the format is sniffed."""
    reader = name if name in READERS else sniff_reader(path)
    tasks = unique_ids(READERS[reader](path), path)
    if name not in READERS:
        from leakray.schema import T

        for task in tasks:
            task[T.BENCHMARK] = name
    return tasks


def benchmark_path(name: str, path: str | Path | None = None) -> str:
    """The file a benchmark is read from (the cleaned export and the screener read it again):
    the given path, else the registered default, else HumanEval's packaged copy."""
    path = path or DEFAULT_PATHS.get(name)
    if path is None and name == "humaneval":
        from leakray.data.humaneval import packaged_path

        path = packaged_path()
    if path is None:
        raise BadInput(f"benchmark {name} needs a path", field="benchmark.path")
    return str(path)
