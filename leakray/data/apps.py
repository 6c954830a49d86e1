"""APPS (Hugging Face columns): problem_id, question, solutions (JSON list), input_output (JSON:
inputs, outputs, optional fn_name), starter_code, difficulty.

Standard-input problems run under `stdio` (the host compares outputs); call-based ones
(`fn_name`) become Python tests that call the function, or `Solution().fn_name` for LeetCode."""

from __future__ import annotations

import json
from pathlib import Path

from leakray.data.io import iter_records, require
from leakray.data.prompts import as_comment, report_skipped
from leakray.data.tasks import make_task
from leakray.errors import BadInput

_CALL_TESTS = '''
import json as _json
_CASES = _json.loads({cases!r})


def _leakray_call(args):
    cls = globals().get("Solution")
    fn = getattr(cls(), {fn!r}) if cls is not None and hasattr(cls, {fn!r}) else globals()[{fn!r}]
    return fn(*args)


for _args, _want in zip(_CASES["inputs"], _CASES["outputs"]):
    _got = _leakray_call(_args)
    if isinstance(_got, tuple):
        _got = list(_got)
    assert _got == _want or (isinstance(_want, list) and len(_want) == 1 and _got == _want[0]), (_args, _got, _want)
'''


def _json_field(rec, field, path, row):
    value = rec.get(field)
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise BadInput(f"not valid JSON ({exc.msg})", path=str(path), row=row, field=field) from exc
    return value


def read_apps(path: str | Path, benchmark: str = "apps") -> list[dict]:
    path = Path(path)
    tasks, skipped = [], []
    for row, rec in iter_records(path):
        pid = require(rec, "problem_id", path=path, row=row, types=(int, str))
        question = require(rec, "question", path=path, row=row)
        solutions = _json_field(rec, "solutions", path, row) or []
        io = _json_field(rec, "input_output", path, row) or {}
        if not solutions or not io.get("inputs"):
            skipped.append(pid)
            continue
        if not isinstance(solutions, list) or not isinstance(solutions[0], str):
            raise BadInput("expected a JSON list of strings", path=str(path), row=row, field="solutions")
        if not isinstance(io.get("outputs"), list) or len(io["outputs"]) != len(io["inputs"]):
            raise BadInput("'inputs' and 'outputs' must be lists of one length", path=str(path), row=row,
                           field="input_output")
        starter = rec.get("starter_code") or ""
        fn = io.get("fn_name")
        cases = {"inputs": io["inputs"], "outputs": io["outputs"]}
        if fn:
            runner, tests = "python", _CALL_TESTS.format(cases=json.dumps(cases), fn=fn)
        else:
            runner, tests = "stdio", json.dumps(cases)
        text = question + (f"\n\nStarter code:\n{starter}" if starter.strip() else "")
        prompt = as_comment(text, "python")
        tasks.append(make_task(
            benchmark=benchmark, task_id=f"APPS/{pid}", language="python", prompt=prompt,
            reference=prompt + solutions[0], tests=tests, runner=runner, entry_point=fn or "",
            meta={"difficulty": rec.get("difficulty", ""), "starter_code": starter,
                  "n_solutions": len(solutions)}, path=path, row=row,
        ))
    report_skipped(path, "without solutions or test cases", skipped)
    return tasks
