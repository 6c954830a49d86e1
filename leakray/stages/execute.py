"""The execution stage: every completion, as `program_of` its prompt, against the task's tests in
the sandbox (a thread pool of sandboxes per worker)."""

from __future__ import annotations

import logging
import time

import pyarrow as pa

from leakray.data.tasks import program_of
from leakray.schema import C, T, X
from leakray.stages.rows import pylist, row_failed, run_timed, with_columns

LOG = logging.getLogger(__name__)


class ExecuteStage:
    """Runs every completion (as `program_of` the prompt) against the task's tests in the sandbox."""

    def __init__(self, timeout_s: float = 10.0, threads: int = 4, allow_weak_isolation: bool = False):
        from leakray.sandbox import Sandbox, SandboxConfig

        t0 = time.perf_counter()
        self.sandbox = Sandbox(SandboxConfig(timeout_s=timeout_s, allow_weak_isolation=allow_weak_isolation))
        self.threads = threads
        self._load_s = time.perf_counter() - t0

    def __call__(self, batch: pa.Table) -> pa.Table:
        return run_timed(self, "ExecuteStage", "execute", self._execute, batch)

    def _execute(self, batch: pa.Table) -> pa.Table:
        rows = batch.select([C.TASK_ID, C.LANGUAGE, C.PROMPT, C.COMPLETIONS, T.TESTS, T.RUNNER]).to_pylist()
        for row, notes in zip(rows, pylist(batch, C.NOTES) if C.NOTES in batch.column_names else [[]] * len(rows)):
            row[C.NOTES] = notes
        requests, spans = [], []
        for row in rows:
            start = len(requests)
            if row[T.TESTS].strip() and not row_failed(row[C.NOTES]):
                for j, completion in enumerate(row[C.COMPLETIONS]):
                    requests.append({
                        X.ID: f"{row[C.TASK_ID]}#{j}", X.LANGUAGE: row[C.LANGUAGE], X.RUNNER: row[T.RUNNER],
                        X.PROGRAM: program_of(row[C.PROMPT], completion), X.TESTS: row[T.TESTS],
                    })
            spans.append((start, len(requests)))
        results = self._run(requests)
        status, passed, notes = [], [], []
        for (a, b), row in zip(spans, rows):
            notes.append(list(row[C.NOTES] or []))
            if a == b:  # no tests: the pass feature is absent, not "failed" (or the row failed earlier)
                status.append(["not-run" if row_failed(row[C.NOTES]) else "no-tests"] * len(row[C.COMPLETIONS]))
                passed.append([False] * len(row[C.COMPLETIONS]))
                continue
            status.append([r[X.STATUS] for r in results[a:b]])
            passed.append([bool(r[X.PASSED]) and r[X.STATUS] == "passed" for r in results[a:b]])
            broken = next((r for r in results[a:b] if r.get(X.HARNESS_ERROR)), None)
            if broken is not None:  # not the program's verdict: the row goes to the errors file, not "not passed"
                LOG.warning("sandbox harness failed twice on %s: %s", broken[X.ID], broken[X.STDERR_TAIL][-500:])
                notes[-1].append(f"failed:sandbox_harness:{broken[X.HARNESS_ERROR]}")
        return with_columns(batch, {
            C.EXEC_STATUS: status, C.PASSED: passed,
            C.HAS_TESTS: [bool(row[T.TESTS].strip()) for row in rows], C.NOTES: notes,
        })

    def _run(self, requests: list[dict]) -> list[dict]:
        """Results in order; a result the sandbox failed to produce (`X.HARNESS_ERROR`) is tried once more."""
        from leakray.sandbox.core import error_result

        # a NUL byte never compiles: the model's own error, not a bad request that would fail the row
        results = [error_result(r[X.ID], "the program holds a NUL byte") if "\x00" in r[X.PROGRAM] else None
                   for r in requests]
        todo = [i for i, r in enumerate(results) if r is None]
        for _ in range(2):
            for i, r in zip(todo, self.sandbox.run_many([requests[i] for i in todo], workers=self.threads)):
                results[i] = r
            todo = [i for i in todo if results[i].get(X.HARNESS_ERROR)]
            if not todo:
                break
        return results
