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
    assert near_copies(*_solutions(load_benchmark("humaneval"))) == [("HumanEval/56", "HumanEval/61", 0.744)]


@pytest.mark.skipif(not (SHARED_BENCHMARKS / "mbjp_release_v1.2.jsonl.gz").exists(), reason="no shared benchmarks")
def test_a_languages_idioms_are_not_copies():
    """MBJP's short Java solutions share their idioms (a loop over a list adding to a result): at the
    screener's 2-token shingles 66 pairs cleared 0.7, chaining 13 different problems ("remove odd
    numbers", "find even numbers", "numbers divisible by m and n", ...) into one group; at 5 tokens
    the pairs left are the same text: one solution under two problems, odd and even sums, two pair
    counts that differ in one condition."""
    from leakray.screen.index import ScreenConfig
    from leakray.screen.siblings import task_copy_groups, task_near_copies

    tasks = load_benchmark_file("mbjp", str(SHARED_BENCHMARKS / "mbjp_release_v1.2.jsonl.gz"))
    assert [(a, b) for a, b, _ in task_near_copies(tasks)] == \
        [("MBJP/54", "MBJP/428"), ("MBJP/797", "MBJP/962"), ("MBJP/767", "MBJP/831")]
    bigrams = task_near_copies(tasks, ScreenConfig())
    assert len(bigrams) == 66 and max(len(g) for g in task_copy_groups(tasks, ScreenConfig())) == 13
    assert ("MBJP/412", "MBJP/629") in {(a, b) for a, b, _ in bigrams}  # remove odd ~ find even numbers


@pytest.mark.skipif(not (SHARED_BENCHMARKS / "humaneval_java.jsonl.gz").exists(), reason="no shared benchmarks")
def test_lsh_finds_every_pair_that_all_pairs_finds():
    from leakray.screen.index import ScreenConfig

    ids, texts = _solutions(load_benchmark_file("hejava", str(SHARED_BENCHMARKS / "humaneval_java.jsonl.gz")))
    for ngram, measured in ((5, 1), (2, 5)):  # the default's 5-token shingles, and the screener's 2
        sets = shingle_batch(texts, ngram)
        exact = {(ids[i], ids[j]) for i, j in itertools.combinations(range(len(ids)), 2)
                 if min(sets.sizes[i], sets.sizes[j]) >= 8 and jaccard_exact(sets[i], sets[j]) >= 0.7}
        got = near_copies(ids, texts, ScreenConfig(ngram=ngram))
        assert {(a, b) for a, b, _ in got} == exact and len(exact) == measured  # Java/56 ~ Java/61 in both
        assert ("Java/56", "Java/61") in exact
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
    from leakray.report.audit import benchmark_near_copies
    from leakray.report.audit_markdown import near_copies_words
    from leakray.screen.siblings import task_near_copies

    tasks = load_benchmark("humaneval")
    by_id = {t[T.TASK_ID]: t for t in tasks}
    ids = ["HumanEval/0", "HumanEval/56", "HumanEval/61"]
    pairs = task_near_copies([by_id[t] for t in ids])
    c = benchmark_near_copies(pairs, ids, np.array(["clean", "clean", "suspected"]))
    assert c["of"] == {"HumanEval/56": ["HumanEval/61"], "HumanEval/61": ["HumanEval/56"]}
    assert c["clean_copies_of_flagged"] == ["HumanEval/56"]
    words = near_copies_words(c)
    assert "1 pair: HumanEval/56 ~ HumanEval/61 (0.74)" in words and "1 clean task is a near-copy" in words
    assert "Jaccard ≥ 0.7 of their 5-token shingles" in words
    assert "stays in the cleaned file (`audit.cleaned_near_copies=keep`)" in words
    assert "is removed from the cleaned file with it: HumanEval/56" in near_copies_words({**c, "dropped": True})
    both = benchmark_near_copies(pairs, ids, np.array(["clean", "suspected", "confirmed"]))
    assert both["clean_copies_of_flagged"] == [] and "stay" not in near_copies_words(both)
    two = ids[:2]
    none = benchmark_near_copies(task_near_copies([by_id[t] for t in two]), two, np.array(["clean", "clean"]))
    assert near_copies_words(none) == ""


def test_benchmarks_copies_lists_the_pairs_and_refuses_bad_input(tmp_path, capsys):
    import json

    from leakray.cli import main

    out = tmp_path / "pairs.jsonl"
    assert main(["benchmarks", "copies", "humaneval", "--output", str(out)]) == 0
    got = capsys.readouterr()
    assert got.out == "HumanEval/56\tHumanEval/61\t0.744\n" and "1 pair of near-copies among 164 tasks" in got.err
    assert [json.loads(line) for line in out.read_text().splitlines()] == \
        [{"a": "HumanEval/56", "b": "HumanEval/61", "jaccard": 0.744}]
    assert main(["benchmarks", "copies", "humaneval", "--threshold", "0.6", "--ngram", "2"]) == 0
    got = capsys.readouterr()
    assert len(got.out.splitlines()) == 4 and "2-token shingles" in got.err  # /55 ~ /63, /108 ~ /145, /40 ~ /43 too
    assert main(["benchmarks", "copies", "humaneval", "--threshold", "1.5"]) == 2
    assert main(["benchmarks", "copies", "humaneval", "--ngram", "0"]) == 2
    capsys.readouterr()
    # --against: a private split checked against the public benchmark (each task with its closest copy)
    he1 = next(t for t in load_benchmark("humaneval") if t[T.TASK_ID] == "HumanEval/1")
    body = continuation(he1[T.PROMPT], he1[T.REFERENCE])
    rows = [{"task_id": "Mine/0", "prompt": he1[T.PROMPT], "canonical_solution": body.replace("result", "found"),
             "test": "def check(candidate):\n    assert True\n", "entry_point": "separate_paren_groups"},
            {"task_id": "Mine/1", "prompt": "def g(xs):\n",
             "canonical_solution": "    return sorted(set(x * 3 - 1 for x in xs if x % 7), reverse=True)[:5]\n",
             "test": "def check(candidate):\n    assert True\n", "entry_point": "g"}]
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["benchmarks", "copies", "humaneval", "--against", f"mine={mine}"]) == 0
    got = capsys.readouterr()
    assert [line.split("\t")[:2] for line in got.out.splitlines()] == [["Mine/0", "HumanEval/1"]]
    assert f"1 of 2 tasks of mine={mine} nearly copy a task of humaneval" in got.err
    assert main(["benchmarks", "copies", "humaneval", "--against", str(tmp_path / "missing.jsonl")]) == 2
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
    assert across == [["HumanEval/61", "HumanEval/56", 0.744]]
    assert straddling_copies(collection({"HumanEval/56": 1, "HumanEval/61": 1, "HumanEval/0": 0})) == []
    line = straddling_line({"near_copies_across_split": {"target": [], "shadow": across}})
    assert "shadow: member HumanEval/61 ~ non-member HumanEval/56 (0.74)" in line[1]
    assert straddling_line({"near_copies_across_split": {"target": [], "shadow": []}}) == []
    assert straddling_line({}) == []


def test_copy_groups_join_pairs_into_groups():
    from leakray.screen.siblings import copy_groups

    assert copy_groups([("b", "c", 0.9), ("a", "b", 0.8), ("x", "y", 0.7)]) == [["a", "b", "c"], ["x", "y"]]
    assert copy_groups([]) == []


def test_keep_together_moves_a_split_group_and_keeps_every_side_and_stratum():
    from leakray.data.folds import keep_together

    part = {"a": 0, "b": 1, "c": 1, "d": 0, "e": 0, "f": 1, "g": 0, "h": 1}
    length = dict(zip(part, (10, 50, 52, 11, 49, 30, 31, 12)))
    same, swaps = keep_together(part, [["b", "c"], ["a", "d"]], length)  # both groups already on one side
    assert same == part and swaps == []
    # a triple with two of its tasks on side 1 goes there; a goes over and the side-1 task of no group
    # nearest a's length comes back in its place
    out, swaps = keep_together(part, [["a", "b", "c"]], length)
    assert out["a"] == out["b"] == out["c"] == 1 and swaps == [("a", "h")] and out["h"] == 0
    assert sorted(out.values()) == sorted(part.values())
    # stratified: the trade stays within a's stratum, so each side keeps its strata counts
    stratum = dict(zip(part, (1, 1, 0, 0, 1, 1, 0, 0)))
    out, swaps = keep_together(part, [["a", "b"]], length, stratum)
    assert out["a"] == out["b"] and [stratum[t] for t, _ in swaps] == [stratum[p] for _, p in swaps]
    for side in (0, 1):
        assert sorted(stratum[t] for t in out if out[t] == side) == sorted(stratum[t] for t in part if part[t] == side)
    # nobody to trade with: the group stays split rather than unbalance the sides
    out, swaps = keep_together({"a": 0, "b": 1}, [["a", "b"]])
    assert out == {"a": 0, "b": 1} and swaps == []


def _straddling(groups, side):
    return sum(len({side[t] for t in g}) > 1 for g in groups)


def test_every_split_keeps_humanevals_near_copies_on_one_side(tmp_path):
    """HumanEval/56 and /61: the default folds put them in different folds (the target's and the
    shadow's halves); with `benchmark.near_copies=together` (the default) the folds stage, the
    audit's shadow and planted splits and the card's halves keep them on one side, at the same sizes."""
    import io
    import json

    import pyarrow as pa
    import pyarrow.compute  # noqa: F401  (pa.compute below)

    from leakray.config import AuditConfig, SimulateConfig
    from leakray.console import Console
    from leakray.data.folds import assign_folds
    from leakray.protocols.audit import split_members
    from leakray.protocols.card import stratified_half
    from leakray.protocols.simulate import copy_groups_of, simulate_stages
    from leakray.runs import StageRunner
    from leakray.schema import C

    tasks = load_benchmark("humaneval")
    pair = ["HumanEval/56", "HumanEval/61"]
    plain = assign_folds(tasks)
    assert plain[pair[0]] != plain[pair[1]]  # what the default split did before
    cfg = SimulateConfig()
    assert copy_groups_of(cfg, tasks) == [pair]
    runner = StageRunner(tmp_path, Console(stream=io.StringIO()))
    (folds_stage,) = [s for s in simulate_stages(cfg, tasks, runner, "bwrap") if getattr(s, "name", None) == "folds"]
    info = folds_stage.run(tmp_path)
    folds = json.loads((tmp_path / "folds.json").read_text())
    assert folds[pair[0]] == folds[pair[1]] and info["near_copy_groups"] == [pair]
    assert info["sizes"] == [41, 41, 41, 41] and len(info["moved_to_their_copies"]) == 1
    assert folds_stage.summary(info).endswith("1 group(s) of near-copies each in one fold (1 task(s) traded)")
    assert sum(folds[t] != plain[t] for t in folds) == 2  # one trade, nothing else moved
    ignore = SimulateConfig.model_validate({"benchmark": {"near_copies": "ignore"}})
    assert copy_groups_of(ignore, tasks) == []

    ids = [t[T.TASK_ID] for t in tasks]
    length = {t[T.TASK_ID]: len(t[T.REFERENCE]) for t in tasks}
    for share, seed in ((0.5, 0), (0.5, 1), (0.2, 0), (0.25, 3)):
        members = set(split_members(ids, share, seed, [pair], length))
        assert len(members) == round(share * 164) and (pair[0] in members) == (pair[1] in members)
        assert len(members ^ set(split_members(ids, share, seed))) <= 2  # at most one trade
    # the card's halves: stratified by membership and the pair on one side
    members = set(split_members(ids, 0.5, AuditConfig().audit.shadow_seed, [pair], length))
    shadow = pa.table({C.TASK_ID: ids, C.MEMBER: pa.array([int(t in members) for t in ids], pa.int8()),
                       C.REFERENCE: [length[t] * "x" for t in ids]})
    for seed in range(6):
        fit, val = stratified_half(shadow, 0.5, seed, [pair])
        fit_ids = set(fit.column(C.TASK_ID).to_pylist())
        assert (pair[0] in fit_ids) == (pair[1] in fit_ids) and fit.num_rows + val.num_rows == 164
        plain_fit, _ = stratified_half(shadow, 0.5, seed)
        assert fit.num_rows == plain_fit.num_rows
        assert pa.compute.sum(fit.column(C.MEMBER)).as_py() == pa.compute.sum(plain_fit.column(C.MEMBER)).as_py()


@pytest.mark.skipif(not (SHARED_BENCHMARKS / "mbjp_release_v1.2.jsonl.gz").exists(), reason="no shared benchmarks")
def test_mbjps_near_copy_groups_never_straddle_a_split():
    """MBJP's groups at the screener's 2-token shingles (25 groups of 77 tasks: more than the default
    bar's 3 pairs, so that a plain draw splits many): the grouped draw splits none."""
    from leakray.protocols.audit import split_members
    from leakray.screen.index import ScreenConfig
    from leakray.screen.siblings import task_copy_groups

    tasks = load_benchmark_file("mbjp", str(SHARED_BENCHMARKS / "mbjp_release_v1.2.jsonl.gz"))
    groups = task_copy_groups(tasks, ScreenConfig())
    ids = [t[T.TASK_ID] for t in tasks]
    length = {t[T.TASK_ID]: len(t[T.REFERENCE]) for t in tasks}
    plain = set(split_members(ids, 0.5, 0))
    assert _straddling(groups, {t: t in plain for t in ids}) >= 10  # measured: see docs/SCREEN.md
    grouped = set(split_members(ids, 0.5, 0, groups, length))
    assert _straddling(groups, {t: t in grouped for t in ids}) == 0 and len(grouped) == len(plain)


def test_crossfit_leaves_out_near_copies_of_the_cards_fit_tasks():
    from types import SimpleNamespace

    from leakray.report.audit import crossfit_scores

    card = SimpleNamespace(meta={"fit_task_ids": ["a", "b"], "detectors": {"learned": {"spec": {"learns": True}},
                                                                           "plain": {"spec": {}}}})
    ids = ["a", "b", "c", "d", "e"]
    scores = {"learned": np.arange(5.0), "plain": np.arange(5.0)}
    got = crossfit_scores(card, ids, scores, [("b", "d", 0.9), ("c", "e", 0.8)])
    assert got["copies_of_fit_tasks"] == ["d"] and got["left_out_tasks"] == 3
    assert np.isnan(scores["learned"][[0, 1, 3]]).all() and scores["learned"][[2, 4]].tolist() == [2.0, 4.0]
    assert scores["plain"].tolist() == [0, 1, 2, 3, 4]  # a detector that learns nothing scores every task
    from leakray.report.audit_markdown import copies_of_fit_words

    assert copies_of_fit_words(got["copies_of_fit_tasks"]) == \
        ", none of them a near-copy of a training task (1 such left out: d)"
    assert copies_of_fit_words([]) == ""
