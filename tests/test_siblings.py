"""Near-copies inside one benchmark (`screen.siblings`) and the audit report's sentence on them."""

import itertools

import numpy as np
import pytest
from conftest import SHARED_BENCHMARKS

from leakray.data.registry import load_benchmark, load_benchmark_file
from leakray.data.tasks import continuation
from leakray.schema import T
from leakray.screen.shingle import shingle_batch
from leakray.screen.siblings import near_copies
from leakray.screen.verify import jaccard_exact


def _solutions(tasks):
    return [t[T.TASK_ID] for t in tasks], [continuation(t[T.PROMPT], t[T.REFERENCE]) for t in tasks]


def test_humanevals_one_near_copy_is_found():
    """HumanEval/56 and /61: the same bracket matcher with `<>` for `()`; nothing else is that close."""
    assert near_copies(*_solutions(load_benchmark("humaneval"))) == [("HumanEval/56", "HumanEval/61", 0.882)]


@pytest.mark.skipif(not (SHARED_BENCHMARKS / "humaneval_java.jsonl.gz").exists(), reason="no shared benchmarks")
def test_lsh_finds_every_pair_that_all_pairs_finds():
    ids, texts = _solutions(load_benchmark_file("hejava", str(SHARED_BENCHMARKS / "humaneval_java.jsonl.gz")))
    sets = shingle_batch(texts, 2)
    exact = {(ids[i], ids[j]) for i, j in itertools.combinations(range(len(ids)), 2)
             if min(sets.sizes[i], sets.sizes[j]) >= 8 and jaccard_exact(sets[i], sets[j]) >= 0.7}
    got = near_copies(ids, texts)
    assert {(a, b) for a, b, _ in got} == exact and len(exact) >= 5  # measured: 5 (Java/56 ~ Java/61 among them)
    assert [j for *_, j in got] == sorted((j for *_, j in got), reverse=True)


def test_short_or_different_texts_are_no_copies():
    body = "def f(xs):\n    total = 0\n    for x in xs:\n        if x > 0:\n            total += x * x\n    return total\n"
    ids = ["a", "b", "c", "d", "e"]
    texts = [body, body.replace("x * x", "x * 2"), "return a + b", "return a + b", "print('something else entirely')"]
    got = near_copies(ids, texts)
    assert [(a, b) for a, b, _ in got] == [("a", "b")] and got[0][2] < 1.0  # the two one-liners are too short
    with pytest.raises(ValueError, match="ids for"):
        near_copies(ids, texts[:2])


def test_the_report_names_clean_copies_of_flagged_tasks():
    from leakray.report.audit import benchmark_near_copies, near_copies_words

    tasks = load_benchmark("humaneval")
    by_id = {t[T.TASK_ID]: t for t in tasks}
    ids = ["HumanEval/0", "HumanEval/56", "HumanEval/61"]
    c = benchmark_near_copies(by_id, ids, np.array(["clean", "clean", "suspected"]))
    assert c["of"] == {"HumanEval/56": ["HumanEval/61"], "HumanEval/61": ["HumanEval/56"]}
    assert c["clean_copies_of_flagged"] == ["HumanEval/56"]
    words = near_copies_words(c)
    assert "1 pair: HumanEval/56 ~ HumanEval/61 (0.88)" in words and "1 clean task is a near-copy" in words
    both = benchmark_near_copies(by_id, ids, np.array(["clean", "suspected", "confirmed"]))
    assert both["clean_copies_of_flagged"] == [] and "stay" not in near_copies_words(both)
    assert near_copies_words(benchmark_near_copies(by_id, ids[:2], np.array(["clean", "clean"]))) == ""


def test_benchmarks_copies_lists_the_pairs_and_refuses_bad_input(tmp_path, capsys):
    import json

    from leakray.cli import main

    out = tmp_path / "pairs.jsonl"
    assert main(["benchmarks", "copies", "humaneval", "--output", str(out)]) == 0
    got = capsys.readouterr()
    assert got.out == "HumanEval/56\tHumanEval/61\t0.882\n" and "1 pair of near-copies among 164 tasks" in got.err
    assert [json.loads(line) for line in out.read_text().splitlines()] == \
        [{"a": "HumanEval/56", "b": "HumanEval/61", "jaccard": 0.882}]
    assert main(["benchmarks", "copies", "humaneval", "--threshold", "0.6"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4  # /55 ~ /63, /108 ~ /145, /40 ~ /43 too
    assert main(["benchmarks", "copies", "humaneval", "--threshold", "1.5"]) == 2
    assert main(["benchmarks", "copies", str(tmp_path / "missing.jsonl")]) == 2
    assert "neither a registered benchmark" in capsys.readouterr().err


def test_the_simulate_report_warns_of_a_near_copy_on_both_sides_of_a_split():
    import pyarrow as pa

    from leakray.report.simulate import render_markdown, straddling_copies, straddling_line
    from leakray.schema import C

    by_id = {t[T.TASK_ID]: t for t in load_benchmark("humaneval")}

    def collection(members: dict[str, int]) -> pa.Table:
        return pa.table({C.TASK_ID: list(members), C.MEMBER: list(members.values()),
                         C.PROMPT: [by_id[t][T.PROMPT] for t in members],
                         C.REFERENCE: [by_id[t][T.REFERENCE] for t in members]})

    across = straddling_copies(collection({"HumanEval/0": 1, "HumanEval/56": 0, "HumanEval/61": 1}))
    assert across == [["HumanEval/61", "HumanEval/56", 0.882]]
    assert straddling_copies(collection({"HumanEval/56": 1, "HumanEval/61": 1, "HumanEval/0": 0})) == []
    line = straddling_line({"near_copies_across_split": {"target": [], "shadow": across}})
    assert "shadow: member HumanEval/61 ~ non-member HumanEval/56 (0.88)" in line[1]
    assert straddling_line({"near_copies_across_split": {"target": [], "shadow": []}}) == []
    assert straddling_line({}) == []
