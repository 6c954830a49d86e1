import gzip
import json

import pytest

from leakray.data.folds import assign_folds
from leakray.data.humaneval import read_humaneval
from leakray.data.mbpp import read_mbpp
from leakray.data.registry import load_benchmark, load_benchmark_file
from leakray.data.tasks import make_task, tasks_to_table
from leakray.errors import BadInput
from leakray.schema import T

FIX = __import__("pathlib").Path(__file__).parent / "fixtures"


def test_humaneval_from_package_is_complete_and_runnable_text():
    tasks = read_humaneval()
    assert len(tasks) == 164
    t = tasks[0]
    assert t[T.TASK_ID] == "HumanEval/0" and t[T.REFERENCE].startswith(t[T.PROMPT])
    assert t[T.TESTS].rstrip().endswith(f"check({t[T.ENTRY_POINT]})")
    compile(t[T.REFERENCE] + "\n" + t[T.TESTS], "x", "exec")
    assert tasks_to_table(tasks).num_rows == 164


def test_humaneval_bad_row_names_file_line_and_field(tmp_path):
    path = tmp_path / "he.jsonl.gz"
    good = {"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
            "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
    bad = dict(good, task_id="HumanEval/1")
    del bad["canonical_solution"]
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(BadInput) as exc:
        read_humaneval(path)
    assert "he.jsonl.gz" in str(exc.value) and "row 2" in str(exc.value) and "canonical_solution" in str(exc.value)


def test_mbpp_prompt_has_text_and_tests_and_reference_runs():
    tasks = read_mbpp(FIX / "mbpp_small.jsonl")
    assert [t[T.TASK_ID] for t in tasks] == ["MBPP/2", "MBPP/3"]
    t = tasks[0]
    assert "shared elements" in t[T.PROMPT] and "similar_elements((3, 4, 5, 6)" in t[T.PROMPT]
    assert t[T.ENTRY_POINT] == "similar_elements"
    ns = {}
    exec(compile(t[T.PROMPT] + t[T.REFERENCE] + "\n" + t[T.TESTS], "mbpp", "exec"), ns)  # trusted fixture


def test_mbpp_malformed_json_line(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    path.write_text((FIX / "mbpp_small.jsonl").read_text() + "{not json\n")
    with pytest.raises(BadInput, match="row 3"):
        read_mbpp(path)


def test_make_task_refuses_unknown_runner_and_empty_reference():
    with pytest.raises(BadInput, match="runner"):
        make_task(benchmark="b", task_id="1", language="python", prompt="p", reference="r", tests="",
                  runner="cobol")
    with pytest.raises(BadInput, match="reference"):
        make_task(benchmark="b", task_id="1", language="python", prompt="p", reference=" ", tests="")


def test_load_by_name_and_sniffed_path():
    assert len(load_benchmark("humaneval")) == 164
    tasks = load_benchmark_file("mine", FIX / "mbpp_small.jsonl")
    assert {t[T.BENCHMARK] for t in tasks} == {"mine"} and len(tasks) == 2
    with pytest.raises(BadInput, match="unknown benchmark"):
        load_benchmark("nope")


def test_folds_are_by_task_equal_and_seeded():
    tasks = read_humaneval()
    a, b, c = assign_folds(tasks, 4, 0), assign_folds(tasks, 4, 0), assign_folds(tasks, 4, 1)
    assert a == b and a != c
    sizes = [sum(1 for f in a.values() if f == i) for i in range(4)]
    assert sizes == [41, 41, 41, 41] and set(a) == {t[T.TASK_ID] for t in tasks}


def test_length_balanced_folds_hold_the_same_lengths_on_both_sides():
    """A plain split can give members shorter tasks (HumanEval's default split: reference-length
    AUC 0.29 of D1 against D2), and a detector that follows length then 'detects' a leak that is
    not there. Balanced by length, members and non-members are alike in length on every seed."""
    from sklearn.metrics import roc_auc_score

    tasks = read_humaneval()
    length = {t[T.TASK_ID]: len(t[T.REFERENCE]) for t in tasks}

    def length_auc(folds):  # D1 (members) against D2 (non-members) of the target's side
        d1 = [length[t] for t, f in folds.items() if f == 0]
        d2 = [length[t] for t, f in folds.items() if f == 1]
        return roc_auc_score([1] * len(d1) + [0] * len(d2), d1 + d2)

    plain = [length_auc(assign_folds(tasks, 4, s)) for s in range(6)]
    balanced = [assign_folds(tasks, 4, s, "length") for s in range(6)]
    assert abs(plain[0] - 0.293) < 0.01 and max(abs(a - 0.5) for a in plain) > 0.15
    assert max(abs(length_auc(b) - 0.5) for b in balanced) < 0.06, [length_auc(b) for b in balanced]
    for b in balanced:
        assert sorted(b) == sorted(length) and [sum(1 for f in b.values() if f == i) for i in range(4)] == [41] * 4
    assert balanced[0] == assign_folds(tasks, 4, 0, "length") and balanced[0] != balanced[1]
    odd = assign_folds(tasks[:10], 4, 0, "length")  # a short last run goes to the first folds
    assert [sum(1 for f in odd.values() if f == i) for i in range(4)] == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="fold balance"):
        assign_folds(tasks, 4, 0, "size")
