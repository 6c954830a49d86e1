"""Readers for HumanEval-X, MBXP, NaturalCodeBench, EvoCodeBench, ClassEval and APPS, on small
fixtures in each upstream format; every reference must pass its own tests in the sandbox."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from leakray.data.registry import load_benchmark, load_benchmark_file, sniff_reader
from leakray.data.tasks import tasks_to_table
from leakray.errors import BadInput
from leakray.sandbox import Sandbox, SandboxConfig
from leakray.schema import T, X

FIX = Path(__file__).parent / "fixtures"
HAS_JAVA = shutil.which("javac") is not None

CASES = [  # fixture, reader, benchmark names, runners, first task id
    ("humaneval-x-java.jsonl", "humaneval-x", {"humaneval-x-java"}, {"java-main"}, "Java/0"),
    ("humaneval-x-python.jsonl", "humaneval-x", {"humaneval-x-python"}, {"python"}, "Python/0"),
    ("mbxp-java.jsonl", "mbxp", {"mbxp-java"}, {"java-main"}, "MBJP/1"),
    ("mbxp-python.jsonl", "mbxp", {"mbxp-python"}, {"python"}, "MBPP/2"),
    ("naturalcodebench-python.jsonl", "naturalcodebench", {"naturalcodebench-python"}, {"pytest"}, "131"),
    ("naturalcodebench-java.jsonl", "naturalcodebench", {"naturalcodebench-java"}, {"junit5"}, "132"),
    ("evocodebench.jsonl", "evocodebench", {"evocodebench"}, {"python"}, "boltons.strutils.slugify"),
    ("classeval.json", "classeval", {"classeval"}, {"unittest"}, "ClassEval_0"),
    ("apps.jsonl", "apps", {"apps"}, {"stdio", "python"}, "APPS/4000"),
]


@pytest.fixture(scope="module")
def sb():
    return Sandbox(SandboxConfig(timeout_s=20))


@pytest.mark.parametrize("fixture, reader, benchmarks, runners, first", CASES)
def test_reader_builds_schema_rows(fixture, reader, benchmarks, runners, first):
    path = FIX / fixture
    assert sniff_reader(path) == reader
    tasks = load_benchmark(reader, path)
    assert tasks and tasks[0][T.TASK_ID] == first
    assert {t[T.BENCHMARK] for t in tasks} == benchmarks
    assert {t[T.RUNNER] for t in tasks} <= runners
    tasks_to_table(tasks)  # schema and unique ids
    for t in tasks:
        assert t[T.REFERENCE].startswith(t[T.PROMPT]), t[T.TASK_ID]  # prompt is a code prefix
        assert "source_row" in json.loads(t[T.META])
        if t[T.LANGUAGE] == "python":
            compile(t[T.PROMPT] + "\n    pass\n" if t[T.PROMPT].rstrip().endswith(":") else t[T.PROMPT],
                    "prompt", "exec")
            compile(t[T.REFERENCE], "reference", "exec")


def test_specific_shapes():
    mbxp = load_benchmark("mbxp", FIX / "mbxp-java.jsonl")
    assert len(mbxp) == 2  # the row without a canonical solution is reported and left out
    hx = load_benchmark("humaneval-x", FIX / "humaneval-x-python.jsonl")[0]
    assert hx[T.ENTRY_POINT] == "has_close_elements" and "check(has_close_elements)" in hx[T.TESTS]
    mbpy = load_benchmark("mbxp", FIX / "mbxp-python.jsonl")[0]
    assert mbpy[T.TESTS].rstrip().endswith("check(similar_elements)")
    ncb = load_benchmark("naturalcodebench", FIX / "naturalcodebench-python.jsonl")[0]
    assert "```" not in ncb[T.REFERENCE] and ncb[T.PROMPT].startswith('"""')
    evo = load_benchmark("evocodebench", FIX / "evocodebench.jsonl")
    assert all(t[T.TESTS] == "" and json.loads(t[T.META])["has_tests"] is False for t in evo)
    assert evo[0][T.PROMPT].startswith("def slugify")  # already a code prefix: kept as is
    apps = {t[T.TASK_ID]: t for t in load_benchmark("apps", FIX / "apps.jsonl")}
    assert set(apps) == {"APPS/4000", "APPS/4001", "APPS/4002"}  # 4003 has no solutions
    assert apps["APPS/4000"][T.RUNNER] == "stdio" and apps["APPS/4001"][T.RUNNER] == "python"
    ce = load_benchmark("classeval", FIX / "classeval.json")[0]
    assert ce[T.ENTRY_POINT] == "AccessGatewayFilter"


def test_parquet_and_labels(tmp_path):
    rows = [json.loads(line) for line in (FIX / "apps.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "apps.parquet")
    tasks = load_benchmark_file("apps-mini", tmp_path / "apps.parquet")
    assert len(tasks) == 3 and {t[T.BENCHMARK] for t in tasks} == {"apps-mini"}


@pytest.mark.parametrize("reader, record, field", [
    ("apps", {"problem_id": 1, "question": "q", "solutions": "[\"x\"]", "input_output": "{not json"}, "input_output"),
    ("mbxp", {"task_id": "MBRBP/1", "language": "ruby", "prompt": "p", "canonical_solution": "c", "test": "t",
              "entry_point": "e", "description": "d"}, "language"),
    ("naturalcodebench", {"_id": 1, "prompt": "p", "reference_solution": "x = 1", "testcases": "t"},
     "reference_solution"),
    ("classeval", {"task_id": "C", "skeleton": "s", "solution_code": "", "test": "t", "class_name": "C"},
     "solution_code"),
    ("humaneval-x", {"task_id": "CPP/0", "prompt": "p", "canonical_solution": "c", "test": "t",
                     "declaration": "d", "example_test": ""}, "task_id"),
])
def test_bad_rows_name_file_row_field(tmp_path, reader, record, field):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(BadInput) as err:
        load_benchmark(reader, path)
    assert str(path) in str(err.value) and "row 1" in str(err.value) and field in str(err.value)


def _requests(tasks):
    return [{X.ID: t[T.TASK_ID], X.LANGUAGE: t[T.LANGUAGE], X.RUNNER: t[T.RUNNER],
             X.PROGRAM: t[T.REFERENCE], X.TESTS: t[T.TESTS]} for t in tasks if t[T.TESTS]]


@pytest.mark.parametrize("fixture", ["humaneval-x-python.jsonl", "mbxp-python.jsonl", "naturalcodebench-python.jsonl",
                                     "classeval.json", "apps.jsonl"])
def test_python_references_pass(sb, fixture):
    tasks = load_benchmark(sniff_reader(FIX / fixture), FIX / fixture)
    for res in sb.run_many(_requests(tasks), workers=2):
        assert res[X.PASSED], res


@pytest.mark.slow
@pytest.mark.skipif(not HAS_JAVA, reason="needs a JDK")
@pytest.mark.parametrize("fixture", ["humaneval-x-java.jsonl", "mbxp-java.jsonl", "naturalcodebench-java.jsonl"])
def test_java_references_pass(sb, fixture):
    from leakray.sandbox.java import junit_jars

    tasks = load_benchmark(sniff_reader(FIX / fixture), FIX / fixture)
    if any(t[T.RUNNER] == "junit5" for t in tasks) and not junit_jars():
        pytest.skip("no JUnit 5 jars offline (set LEAKRAY_JUNIT_CLASSPATH)")
    for res in sb.run_many(_requests(tasks), workers=2):
        assert res[X.PASSED], res


def _validate(capsys, *argv):
    import argparse

    from leakray.commands import benchmarks as cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["benchmarks", "validate", *argv, "--workers", "2", "--timeout", "20"])
    rc = args.func(args)
    return rc, capsys.readouterr().out


def test_validate_exit_status_and_known_defects(tmp_path, capsys):
    good = {"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
            "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
    wrong = dict(good, task_id="HumanEval/1", canonical_solution="    return 2\n")
    # a reference with top-level code after the function: a verbatim completion would be cut there
    cut = dict(good, task_id="HumanEval/2", canonical_solution="    return 1\nVALUE = f()\n",
               test="def check(c):\n    assert c() == 1 and VALUE == 1\n")
    path = tmp_path / "he.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (good, wrong, cut)) + "\n")

    rc, out = _validate(capsys, f"humaneval={path}")
    assert rc == 1 and "2/3 references pass" in out
    assert "FAIL HumanEval/1: reference failed" in out
    assert "FAIL HumanEval/2: stop rule: truncate keeps" in out
    assert "FAIL HumanEval/2: program_of(prompt, continuation) failed where the reference passes" in out
    assert "HumanEval/0" not in out

    known = tmp_path / "known.txt"
    known.write_text("# upstream defects\nHumanEval/2\n")
    rc, out = _validate(capsys, f"humaneval={path}", "--allow-known", "HumanEval/1", "--allow-known", str(known))
    assert rc == 0 and "KNOWN HumanEval/1" in out and "KNOWN HumanEval/2" in out

    path.write_text(json.dumps(good) + "\n")
    assert _validate(capsys, f"humaneval={path}", "--allow-known", "HumanEval/9")[0] == 0
    assert _validate(capsys, str(tmp_path / "missing.jsonl"))[0] == 2
