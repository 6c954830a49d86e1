"""Rewrites of a reference solution: locals renamed consistently, the prompt untouched, and the
program still passes its tests in the sandbox (semantics preserved, proven by the harness)."""

from __future__ import annotations

import pytest

from leakray.data.tasks import continuation, generation_prompt
from leakray.perturb.rewrite import renamable_locals, solution_rewrites

PROMPT = 'def count_up(n):\n    """Numbers below n that are even."""\n'
REF = PROMPT + "    out = []\n    for i in range(n):\n        if i % 2 == 0:\n            out.append(i)\n    return out\n"
TESTS = "assert count_up(5) == [0, 2, 4]\nassert count_up(0) == []\n"


def test_only_the_solutions_own_locals_are_renamed():
    assert renamable_locals(PROMPT, REF, TESTS) == ["i", "out"]
    rewrites = solution_rewrites(PROMPT, REF, TESTS, n=8, seed=0, key="t")
    assert len(rewrites) == 8 and len(set(rewrites)) == 8
    for r in rewrites:
        assert r.startswith(generation_prompt(PROMPT))  # the prompt, byte for byte
        body = continuation(PROMPT, r)
        assert "count_up" not in body and "range(n)" in body  # parameters and builtins stay
        assert "out" not in body.split() and " i " not in body


def test_rewrites_are_seeded_by_task():
    a = solution_rewrites(PROMPT, REF, TESTS, n=4, seed=0, key="t")
    assert a == solution_rewrites(PROMPT, REF, TESTS, n=4, seed=0, key="t")
    assert a != solution_rewrites(PROMPT, REF, TESTS, n=4, seed=0, key="u")


@pytest.mark.parametrize("ref, why", [
    (PROMPT + "    return [x for x in range(n) if eval('x % 2 == 0')]\n", "eval"),
    (PROMPT + "    return list(range(0, n, 2))\n", "no local name"),
])
def test_no_rewrite_where_renaming_is_unsafe_or_empty(ref, why):
    got = solution_rewrites(PROMPT, ref, TESTS)
    assert isinstance(got, str) and why in got


def test_names_the_tests_or_keywords_see_are_kept():
    ref = PROMPT + "    total = sorted(range(0, n, 2), key=None)\n    return total\n"
    assert renamable_locals(PROMPT, ref, "assert count_up(4) == [0, 2]\ntotal = 1\n") == "the solution binds no local name that only it uses"


def test_rewritten_humaneval_solutions_still_pass_their_tests():
    from leakray.data.humaneval import read_humaneval
    from leakray.data.tasks import program_of
    from leakray.sandbox import Sandbox, SandboxConfig
    from leakray.schema import T, X

    tasks = read_humaneval()[:40]
    requests = []
    for t in tasks:
        got = solution_rewrites(t[T.PROMPT], t[T.REFERENCE], t[T.TESTS], n=2, seed=0, key=t[T.TASK_ID])
        if isinstance(got, str):
            continue
        for j, r in enumerate(got):
            requests.append({X.ID: f"{t[T.TASK_ID]}#{j}", X.LANGUAGE: "python", X.RUNNER: t[T.RUNNER],
                             X.PROGRAM: program_of(t[T.PROMPT], continuation(t[T.PROMPT], r)), X.TESTS: t[T.TESTS]})
    assert len(requests) >= 40
    results = Sandbox(SandboxConfig(timeout_s=10, allow_weak_isolation=True)).run_many(requests, workers=2)
    failed = [(r[X.ID], r[X.STATUS]) for r in results if r[X.STATUS] != "passed"]
    assert not failed
