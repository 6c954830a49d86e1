"""The task record every reader produces, and its table form."""

from __future__ import annotations

import json
from collections.abc import Iterable

import pyarrow as pa

from leakray.errors import BadInput
from leakray.schema import LANGUAGES, TASK_SCHEMA, T, X


def make_task(*, benchmark: str, task_id: str, language: str, prompt: str, reference: str,
              tests: str, runner: str | None = None, entry_point: str = "", meta: dict | None = None,
              path=None, row=None) -> dict:
    """Build one task row, refusing it (with file/row/field) if it breaks the schema."""
    runner = runner or X.DEFAULT_RUNNER.get(language, "")
    meta = dict(meta or {})
    if row is not None:  # lets exports write back the very rows that were read
        meta.setdefault("source_row", row)
    task = {
        T.BENCHMARK: benchmark,
        T.TASK_ID: str(task_id),
        T.LANGUAGE: language,
        T.PROMPT: prompt,
        T.REFERENCE: reference,
        T.TESTS: tests or "",
        T.RUNNER: runner,
        T.ENTRY_POINT: entry_point or "",
        T.META: json.dumps(meta, sort_keys=True, default=str),
    }
    if language not in LANGUAGES:  # before the runner, which an unknown language leaves empty
        raise BadInput(f"unknown language {language!r} (expected one of {LANGUAGES})", path=path, row=row,
                       field=T.LANGUAGE)
    for field in T.REQUIRED_NONEMPTY:
        if not isinstance(task[field], str) or not task[field].strip():
            raise BadInput("empty or not a string", path=path, row=row, field=field)
    if runner not in X.RUNNERS:
        raise BadInput(f"unknown runner {runner!r} (expected one of {X.RUNNERS})", path=path, row=row,
                       field=T.RUNNER)
    return task


def tasks_to_table(tasks: Iterable[dict]) -> pa.Table:
    tasks = list(tasks)
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if task[T.TASK_ID] in seen:
            raise BadInput(f"duplicate task_id {task[T.TASK_ID]!r}", row=i, field=T.TASK_ID)
        seen.add(task[T.TASK_ID])
    return pa.Table.from_pylist(tasks, schema=TASK_SCHEMA)


# Prompts end in whitespace ('"""\n'). Generating right after a lone "\n" token is a
# boundary the model never saw in training, where "\n" merges with the indentation
# that follows; ending the prompt at its last visible character lets the model pick
# the merged token itself (and a fine-tuned model otherwise learns "\n" -> EOS).
def generation_prompt(prompt: str) -> str:
    """What a model is given: the prompt without trailing whitespace."""
    return prompt.rstrip()


def continuation(prompt: str, reference: str) -> str:
    """The part of a complete reference solution that continues the generation prompt.

    A reference that does not repeat its prompt (MBPP's `code` after a docstring prompt)
    follows it on a new line, as `prompt + reference` would."""
    base = generation_prompt(prompt)
    if reference.startswith(base):
        return reference[len(base):]
    return reference if reference.startswith("\n") else "\n" + reference


def program_of(prompt: str, completion: str) -> str:
    """The program a completion stands for: completions continue the generation prompt."""
    return generation_prompt(prompt) + completion


def references_that_do_not_compile(tasks: Iterable[dict]) -> list[tuple[str, str]]:
    """(task id, the error) of each Python task whose reference, read as the program a model's
    completion makes (the prompt, then the rest of the reference), is not valid Python: most often
    a prompt that is plain text rather than the program's beginning (MBPP's reader wraps its text
    in a docstring; a benchmark of one's own must do the same). Every completion of such a task
    would fail to compile too. Compiled only, never run."""
    bad = []
    for task in tasks:
        if task[T.LANGUAGE] != "python":
            continue
        program = program_of(task[T.PROMPT], continuation(task[T.PROMPT], task[T.REFERENCE]))
        try:
            compile(program, task[T.TASK_ID], "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
            bad.append((task[T.TASK_ID], f"{type(exc).__name__}{where}: {getattr(exc, 'msg', exc)}"))
    return bad
