"""Proof that a variant keeps the program's meaning: ``variant prompt + (renamed) reference
continuation`` must pass the task's own tests in the sandbox.

The unperturbed reference runs too: when it fails (a data defect, a flaky test), its
variants are recorded as ``baseline-failed`` and left out of the kept rate, since their
failure would say nothing about the perturbation."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from leakray.data.tasks import continuation, program_of
from leakray.errors import BadInput
from leakray.perturb.core import KINDS, NotApplicable, Variant
from leakray.schema import T, X

KEPT, FAILED, NOT_APPLICABLE, BASELINE_FAILED, NO_TESTS = (
    "kept", "failed", "not-applicable", "baseline-failed", "no-tests")


@dataclass(frozen=True)
class Check:
    task_id: str
    language: str
    kind: str
    index: int
    slot: str
    status: str  # one of KEPT, FAILED, NOT_APPLICABLE, BASELINE_FAILED, NO_TESTS
    detail: str = ""  # the sandbox status and last stderr line, or why not applicable

    @property
    def kept(self) -> bool:
        return self.status == KEPT


def _request(rid: str, task: dict, program: str) -> dict:
    return {X.ID: rid, X.LANGUAGE: task[T.LANGUAGE], X.RUNNER: task[T.RUNNER], X.PROGRAM: program,
            X.TESTS: task[T.TESTS]}


def _why(result: dict) -> str:
    last = (result.get(X.STDERR_TAIL) or "").strip().splitlines()[-1:] or [""]
    return f"{result.get(X.STATUS)}: {last[0][:200]}"


def keep_variants(tasks: list[dict], variants: list[list[Variant | NotApplicable]], sandbox,
                  workers: int = 2) -> list[list[Check]]:
    """One ``Check`` per variant, aligned with ``variants`` (one list per task, as ``variants_of``
    gives). ``sandbox`` is a ``leakray.sandbox.Sandbox``."""
    if len(tasks) != len(variants):
        raise BadInput(f"{len(tasks)} tasks but {len(variants)} variant lists")
    requests, owners = [], []  # owners[j] = (task index, variant index or -1 for the baseline)
    for i, (task, vs) in enumerate(zip(tasks, variants)):
        if not task[T.TESTS].strip():
            continue
        cont = continuation(task[T.PROMPT], task[T.REFERENCE])
        requests.append(_request(f"{i}#base", task, program_of(task[T.PROMPT], cont)))
        owners.append((i, -1))
        for j, v in enumerate(vs):
            if isinstance(v, Variant):
                requests.append(_request(f"{i}#{j}", task, program_of(v.prompt, v.reference_continuation(cont))))
                owners.append((i, j))
    results = sandbox.run_many(requests, workers=workers) if requests else []
    by_owner = {owner: r for owner, r in zip(owners, results)}
    out = []
    for i, (task, vs) in enumerate(zip(tasks, variants)):
        base = by_owner.get((i, -1))
        checks = []
        for j, v in enumerate(vs):
            common = (task[T.TASK_ID], task[T.LANGUAGE], v.kind, v.index, v.slot)
            if isinstance(v, NotApplicable):
                checks.append(Check(*common, NOT_APPLICABLE, v.reason))
            elif base is None:
                checks.append(Check(*common, NO_TESTS, "the task has no tests"))
            elif not base[X.PASSED]:
                checks.append(Check(*common, BASELINE_FAILED, _why(base)))
            else:
                r = by_owner[(i, j)]
                ok = bool(r[X.PASSED]) and r[X.STATUS] == "passed"
                checks.append(Check(*common, KEPT if ok else FAILED, "" if ok else _why(r)))
        out.append(checks)
    return out


def kept_rates(checks: list[list[Check]]) -> list[dict]:
    """Per (language, kind): counts of each status, and ``rate`` = kept / (kept + failed) --
    of the variants that exist and whose task's reference passes, the share that still passes."""
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in checks:
        for c in row:
            counts[(c.language, c.kind)][c.status] += 1
    rows = []
    for (language, kind), n in sorted(counts.items(), key=lambda kv: (kv[0][0], KINDS.index(kv[0][1]))):
        tried = n[KEPT] + n[FAILED]
        rows.append({"language": language, "kind": kind, "total": sum(n.values()), KEPT: n[KEPT],
                     FAILED: n[FAILED], NOT_APPLICABLE: n[NOT_APPLICABLE], BASELINE_FAILED: n[BASELINE_FAILED],
                     NO_TESTS: n[NO_TESTS], "rate": n[KEPT] / tried if tried else float("nan")})
    return rows


def format_rates(rows: list[dict]) -> str:
    lines = [f"{'language':8} {'kind':4} {'kept':>5} {'failed':>6} {'n/a':>5} {'base-fail':>9} {'rate':>7}"]
    for r in rows:
        lines.append(f"{r['language']:8} {r['kind']:4} {r[KEPT]:5d} {r[FAILED]:6d} {r[NOT_APPLICABLE]:5d} "
                     f"{r[BASELINE_FAILED]:9d} {100 * r['rate']:6.1f}%")
    return "\n".join(lines)
