"""The parts of a benchmark sample that are screened, and the index's entries (one per part).

A leak is a copy of any part: a prompt published alone, a solution body without its
signature, a test file, or the whole task in a write-up. So every part is screened and the
part that matched is reported.

- ``prompt``:   what the model is given,
- ``solution``: the reference without the prompt it continues (HumanEval's canonical
                solution body); the whole reference where it does not start with the prompt,
- ``tests``:    the tests, without a last line that only calls them (``check(entry_point)``,
                which the harness adds and a published copy of the tests often lacks),
- ``task``:     the complete reference and its tests, as one text.
"""

from __future__ import annotations

import json

from leakray.schema import T

PARTS = ("prompt", "solution", "tests", "task")


def task_parts(task: dict) -> dict[str, str]:
    """Each part's text ("" where the benchmark has none)."""
    prompt, reference, tests = task.get(T.PROMPT) or "", task.get(T.REFERENCE) or "", task.get(T.TESTS) or ""
    entry = task.get(T.ENTRY_POINT) or ""
    if entry:
        lines = tests.rstrip().split("\n")
        while lines and lines[-1].strip() in (f"check({entry})", ""):
            lines.pop()
        tests = "\n".join(lines) + "\n" if lines else ""
    continues = bool(prompt) and reference.startswith(prompt)
    solution = reference[len(prompt):] if continues else reference
    program = reference if continues else "\n".join(t for t in (prompt, reference) if t)
    return {"prompt": prompt, "solution": solution, "tests": tests,
            "task": "\n".join(t for t in (program, tests) if t)}


class Entries:
    """The screened texts, in index order: (benchmark, task_id, part, text, source_row)."""

    def __init__(self):
        self.benchmark: list[str] = []
        self.task_id: list[str] = []
        self.field: list[str] = []  # the part
        self.text: list[str] = []
        self.source_row: list[int | None] = []

    def __len__(self) -> int:
        return len(self.text)

    def data_mask(self) -> list[bool]:
        """Which entries are data, not code: the tests (screened by number-bearing runs where they
        have too few rare shingles)."""
        return [f == "tests" for f in self.field]

    def group_ids(self) -> list[int]:
        """One number per (benchmark, task): its parts are one task when counting boilerplate."""
        ids: dict[tuple[str, str], int] = {}
        return [ids.setdefault(k, len(ids)) for k in zip(self.benchmark, self.task_id)]

    @classmethod
    def from_tasks(cls, tasks_by_benchmark: dict[str, list[dict]], parts: tuple[str, ...] = PARTS) -> Entries:
        """One entry per (task, part); a part whose text is empty or repeats an earlier part of the
        same task (a benchmark without a prompt, say) is left out, so no copy is counted twice."""
        out = cls()
        for name, tasks in tasks_by_benchmark.items():
            for task in tasks:
                meta = json.loads(task.get(T.META) or "{}")
                texts = task_parts(task)
                seen: set[str] = set()
                for part in parts:
                    text = texts[part]
                    if not text.strip() or text in seen:
                        continue
                    seen.add(text)
                    out.benchmark.append(name)
                    out.task_id.append(task[T.TASK_ID])
                    out.field.append(part)
                    out.text.append(text)
                    out.source_row.append(meta.get("source_row"))
        return out
