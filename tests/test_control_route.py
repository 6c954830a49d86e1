"""The control route (evaluate/control_route.py, protocols/control_scores.py): the null measured on
tasks the target cannot have seen. Synthetic scores for the statistics (clean, leaked, a control
of another kind), a toy model that memorised one solution for the scoring pass."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from leakray.errors import BadInput
from leakray.evaluate import audit_routes
from leakray.evaluate import control_route as cr
from leakray.schema import K, T, control_scores_schema


def _sets(rng, n=400, m=400, members=0.0, shift=2.5, ref_shift=0.0):
    """Benchmark and control scores from one null; a share of the benchmark shifted up (members).
    The reference model's per-character likelihood and the lengths follow the tasks' kind only."""
    null = lambda k: rng.gamma(3.0, 0.05, k)  # skewed, not normal: nothing may assume a normal null
    n_mem = int(round(members * n))
    s = np.r_[null(n - n_mem), null(n_mem) + shift * 0.087]
    member = np.r_[np.zeros(n - n_mem, bool), np.ones(n_mem, bool)]
    c = null(m)
    kw = dict(ref_bench=rng.normal(-1.0, 0.2, n), ref_control=rng.normal(-1.0 + ref_shift, 0.2, m),
              len_bench=rng.lognormal(6, 0.4, n), len_control=rng.lognormal(6, 0.4, m))
    return s, c, member, kw


def _estimate(s, c, kw, **more):
    return cr.estimate_control([f"t{i}" for i in range(len(s))], s, [""] * len(s), c, n_boot=200, **kw, **more)


def test_conformal_pvalues_and_bh_by_hand():
    p = cr.conformal_pvalues([0.0, 1.5, 3.0, 5.0], [1.0, 2.0, 3.0])
    assert p.tolist() == [1.0, 0.75, 0.5, 0.25]  # (1 + #{c >= x}) / (m + 1): ties count as at least as large
    assert cr.bh_flags([0.001, 0.02, 0.03, 0.5], 0.1).tolist() == [True, True, True, False]  # 0.03 <= 0.1 * 3/4
    assert cr.bh_flags([0.2, 0.3], 0.1).tolist() == [False, False]
    assert cr.leaked_share([0.1, 0.2, 0.6, 0.9], 0.5) == 0.0  # 2 of 4 above 0.5: pi0 = 1
    assert cr.leaked_share([0.1, 0.2, 0.3, 0.9], 0.5) == pytest.approx(0.5)


def test_clean_benchmark_gets_uniform_pvalues_no_leak_and_no_flags():
    """Across seeds: p-values uniform, the test does not fire more than its level allows, the share ~0."""
    rng = np.random.default_rng(0)
    fired, refused, estimates = 0, 0, []
    for _ in range(20):
        s, c, _, kw = _sets(rng)
        out = _estimate(s, c, kw)
        if not out["exchangeability"]["ok"]:  # two KS tests at 1%: a false alarm now and then, never a number
            refused += 1
            assert not out["usable"] and out["detected"] is None and out["n_flagged"] == 0
            continue
        assert out["usable"] and out["n_flagged"] <= 0.05 * len(s)
        assert out["ci"][0] == 0.0 and out["estimate"] <= 0.10
        fired += out["detected"]
        estimates.append(out["estimate"])
    assert refused <= 2 and fired <= 3  # 5% level over 20 clean benchmarks
    assert np.mean(estimates) <= 0.05
    s, c, _, kw = _sets(rng)
    p = _estimate(s, c, kw)["per_task"]["p"]
    assert stats.kstest(p, "uniform").pvalue > 0.01


def test_a_quarter_leaked_is_detected_and_estimated_within_ten_points():
    rng = np.random.default_rng(1)
    s, c, member, kw = _sets(rng, n=600, m=600, members=0.25, shift=4.0)
    out = _estimate(s, c, kw)
    assert out["detected"] and out["test"]["p"] < 1e-6
    assert out["usable"] and abs(out["estimate"] - 0.25) <= 0.10 and out["ci"][0] <= 0.25 <= out["ci"][1]
    assert 0 < out["lower_bound"] <= 0.25
    flagged = out["per_task"]["flagged"]
    assert flagged.sum() > 0 and (flagged & ~member).sum() <= 0.2 * flagged.sum()  # FDR 0.1, with slack
    d = audit_routes.decide({"usable": True, "estimate": 0.9, "ci": [0.8, 1.0]}, None, "auto", control_result=out)
    assert d["route"] == "control" and d["estimate"] == out["estimate"]  # the measured null goes first
    assert audit_routes.flags_of(d, None, None, len(s), out).tolist() == flagged.tolist()


def test_a_faint_leak_on_few_tasks_is_detected_with_a_bound_and_no_share():
    """Too few tasks to pin the share (interval wider than max_width): the audit says the target has
    seen the benchmark, with a lower bound, and prints no share — nor lets another route print one."""
    rng = np.random.default_rng(2)
    s, c, _, kw = _sets(rng, n=110, m=55, members=0.25, shift=3.0)
    out = _estimate(s, c, kw)
    assert out["detected"] and not out["usable"] and "wider than 30%" in out["why_unusable"]
    assert out["lower_bound"] > 0
    d = audit_routes.decide({"usable": True, "estimate": 0.0, "ci": [0.0, 0.05]}, None, "auto", control_result=out)
    assert d["route"] is None and d["estimate"] is None
    assert "has seen part of the benchmark" in d["statement"] and d["lower_bound"] == out["lower_bound"]
    # its flags stand without a share (BH on conformal p-values needs no estimate of the share)
    assert audit_routes.flags_of(d, None, None, len(s), out).tolist() == out["per_task"]["flagged"].tolist()


def test_a_control_of_another_kind_is_refused_and_the_other_routes_decide():
    rng = np.random.default_rng(3)
    s, c, _, kw = _sets(rng, ref_shift=0.3)  # the reference model finds the control tasks easier
    out = _estimate(s, c, kw)
    assert not out["usable"] and out["detected"] is None and out["n_flagged"] == 0
    assert "not the benchmark's kind" in out["why_unusable"] and "reference loglik per char" in out["why_unusable"]
    d = audit_routes.decide({"usable": True, "estimate": 0.2, "ci": [0.1, 0.3]}, None, "auto", control_result=out)
    assert d["route"] == "self-calibrated" and "flags_from" not in d
    forced = audit_routes.decide({"usable": True, "estimate": 0.2, "ci": [0.1, 0.3]}, None, "control",
                                 control_result=out)
    assert forced["route"] is None and "not the benchmark's kind" in forced["statement"]


def test_too_few_control_tasks_are_refused():
    rng = np.random.default_rng(4)
    s, c, _, kw = _sets(rng, m=20)
    out = _estimate(s, c, kw)
    assert not out["usable"] and out["detected"] is None and "30 of each needed" in out["why_unusable"]


def _task(tid, prompt, ref):
    return {T.TASK_ID: tid, T.BENCHMARK: "toy", T.LANGUAGE: "python", T.PROMPT: prompt, T.REFERENCE: ref,
            T.TESTS: "", T.RUNNER: "python"}


def test_control_tasks_that_are_benchmark_tasks_are_refused(tmp_path):
    import json

    from leakray.protocols.control_scores import load_control

    bench = [_task("HumanEval/0", "def f(x):\n", "def f(x):\n    return x\n")]
    rows = [{"task_id": "New/0", "prompt": "def g(y):\n", "canonical_solution": "    return y\n",
             "test": "def check(candidate):\n    assert candidate(1) == 1\n", "entry_point": "g"},
            {"task_id": "New/1", "prompt": "def f(x):\n", "canonical_solution": "    return 2 * x\n",
             "test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "f"}]
    path = tmp_path / "control.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BadInput, match="1 control tasks are benchmark tasks too"):
        load_control(f"fresh={path}", bench)
    path.write_text(json.dumps(rows[0]) + "\n")
    (got,), copies = load_control(f"fresh={path}", bench)
    assert got[T.TASK_ID] == "New/0" and got[T.BENCHMARK] == "fresh" and copies == []


def test_control_tasks_that_nearly_copy_a_benchmark_task_are_left_out_and_named(tmp_path):
    """A control task whose solution is a benchmark solution with one name changed may have been read
    in substance with it: it would lift the null. Left out, named, and the report says so."""
    import json

    from leakray.data.registry import load_benchmark
    from leakray.protocols.control_scores import load_control
    from leakray.report.audit_markdown import control_line

    bench = load_benchmark("humaneval")[:40]
    he = {t[T.TASK_ID]: t for t in bench}
    rows = [{"task_id": f"Fresh/{i}", "prompt": he[f"HumanEval/{i}"][T.PROMPT].replace("def ", "def new_"),
             "canonical_solution": he[f"HumanEval/{i}"][T.REFERENCE].split(he[f"HumanEval/{i}"][T.PROMPT], 1)[-1],
             "test": "def check(candidate):\n    assert True\n", "entry_point": "x"} for i in (1, 2)]
    rows[0]["canonical_solution"] = rows[0]["canonical_solution"].replace("result", "found")  # a near-copy
    rows[1]["canonical_solution"] = "    return sum(range(10)) + len(str(number)) * 3 - int(number) // 2\n"
    path = tmp_path / "control.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, copies = load_control(f"fresh={path}", bench)
    assert [t[T.TASK_ID] for t in kept] == ["Fresh/2"]
    assert [c[:2] for c in copies] == [["Fresh/1", "HumanEval/1"]] and 0.7 <= copies[0][2] < 1
    line = control_line({"n_tested": 40, "n_control": 1, "usable": False, "why_unusable": "too few",
                          "near_copies_left_out": copies})
    assert "1 control task left out as near-copies of benchmark tasks, which the target may have read with " \
           "them (Fresh/1 ~ HumanEval/1)" in line
    path.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(BadInput, match="every control task nearly copies a benchmark task"):
        load_control(f"fresh={path}", bench)


def test_statistics_read_the_scores_table_per_character():
    rows = [{K.TASK_ID: "a", K.SET: "benchmark", K.CHARS: 10, K.TARGET_SOLUTION: -5.0, K.TARGET_PROMPT: -5.0,
             K.REFERENCE_SOLUTION: -8.0, K.REFERENCE_PROMPT: -6.0, K.REASON: ""},
            {K.TASK_ID: "b", K.SET: "benchmark", K.CHARS: 10, K.TARGET_SOLUTION: float("nan"), K.TARGET_PROMPT: -1.0,
             K.REFERENCE_SOLUTION: -1.0, K.REFERENCE_PROMPT: -1.0, K.REASON: "no log-probabilities"},
            {K.TASK_ID: "c", K.SET: "control", K.CHARS: 20, K.TARGET_SOLUTION: -10.0, K.TARGET_PROMPT: -10.0,
             K.REFERENCE_SOLUTION: -10.0, K.REFERENCE_PROMPT: -12.0, K.REASON: ""}]
    st = cr.statistics(pa.Table.from_pylist(rows, schema=control_scores_schema()))
    assert st["benchmark"]["task_id"] == ["a", "b"] and st["control"]["task_id"] == ["c"]
    assert st["benchmark"]["s"][0] == pytest.approx(0.4) and np.isnan(st["benchmark"]["s"][1])
    assert st["control"]["s"][0] == pytest.approx(0.1) and st["control"]["ref"][0] == pytest.approx(-1.1)
    with pytest.raises(BadInput, match="no control-route scores"):
        cr.estimate_from_table(pa.Table.from_pylist(rows, schema=control_scores_schema()), ["a", "zzz"])


SEEN_P = 'def count_vowels_twice(text):\n    """Count the vowels of text, doubled."""\n'
SEEN_R = SEEN_P + '    tally = 0\n    for letter in text:\n        if letter in "aeiou":\n            tally += 2\n    return tally\n'
OTHER_P = 'def longest_word_length(sentence):\n    """Length of the longest word of a sentence."""\n'
OTHER_R = OTHER_P + '    return max((len(w) for w in sentence.split()), default=0)\n'
CONTROL_P = 'def sum_of_squares(values):\n    """The sum of the squares of values."""\n'
CONTROL_R = CONTROL_P + '    return sum(v * v for v in values)\n'


@pytest.fixture(scope="module")
def memorised(tiny_lm, tmp_path_factory):
    from leakray.models.finetune import FinetuneConfig, finetune

    out = tmp_path_factory.mktemp("memorised") / "model"
    finetune(tiny_lm[0], [SEEN_R], FinetuneConfig(method="full", epochs=20, lr=1e-2, seed=0), out, progress=False)
    return str(out)


BENCH = [_task("seen", SEEN_P, SEEN_R), _task("other", OTHER_P, OTHER_R)]
CONTROL = [_task("ctl", CONTROL_P, CONTROL_R)]


def test_the_scoring_pass_puts_a_memorised_task_above_unseen_ones(memorised, tiny_lm):
    """Both sets scored by the same code under the target and the reference: the task the target
    memorised has the largest statistic; the rows carry the schema and no reason."""
    from leakray.models.sampler import SampleConfig
    from leakray.protocols.control_scores import control_scores

    table = control_scores(BENCH, CONTROL, memorised, SampleConfig(k=1), str(tiny_lm[0]))
    assert table.schema == control_scores_schema() and table.column(K.SET).to_pylist() == ["benchmark"] * 2 + ["control"]
    assert table.column(K.REASON).to_pylist() == ["", "", ""]
    st = cr.statistics(table)
    seen, other = st["benchmark"]["s"]
    assert seen > other and seen > st["control"]["s"][0]


def test_the_scoring_pass_through_an_endpoint(memorised, tiny_lm):
    """A target behind an OpenAI-compatible endpoint that echoes log-probabilities scores as the
    local model does; one that gives none leaves every row with its reason (the route then refuses)."""
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.models.sampler import SampleConfig
    from leakray.protocols.control_scores import control_scores

    local = control_scores(BENCH, CONTROL, memorised, SampleConfig(k=1), str(tiny_lm[0])).to_pylist()
    with CompletionServer(HFBackend(memorised)) as srv:
        served = control_scores(BENCH, CONTROL, "memorised", SampleConfig(backend="openai", endpoint_url=srv.url, k=1,
                                                                          max_retries=0), str(tiny_lm[0])).to_pylist()
    for a, b in zip(local, served):
        assert not b[K.REASON]
        for col in (K.TARGET_SOLUTION, K.TARGET_PROMPT, K.REFERENCE_SOLUTION, K.REFERENCE_PROMPT):
            assert b[col] == pytest.approx(a[col], abs=1e-3), col
    with CompletionServer(HFBackend(memorised, no_logprobs="ignore")) as srv:
        blind = control_scores(BENCH, CONTROL, "memorised", SampleConfig(backend="openai", endpoint_url=srv.url, k=1,
                                                                         max_retries=0), str(tiny_lm[0])).to_pylist()
    assert all("the target's solution" in r[K.REASON] for r in blind)


def test_difficulty_is_taken_out_without_breaking_the_null():
    """s that also follows the task's difficulty (the reference model's likelihood): the adjusted
    statistic separates a leak better, and a clean benchmark's p-values stay uniform."""
    rng = np.random.default_rng(5)

    def sets(members):
        n, m = 300, 300
        ref_b, ref_c = rng.normal(-1.0, 0.3, n), rng.normal(-1.0, 0.3, m)
        len_b, len_c = rng.lognormal(6, 0.4, n), rng.lognormal(6, 0.4, m)
        s_b = -0.8 * ref_b + 0.05 * np.log(len_b) + rng.normal(0, 0.05, n)
        s_c = -0.8 * ref_c + 0.05 * np.log(len_c) + rng.normal(0, 0.05, m)
        member = rng.random(n) < members
        s_b = s_b + 0.08 * member
        return s_b, s_c, member, dict(ref_bench=ref_b, ref_control=ref_c, len_bench=len_b, len_control=len_c)

    s, c, member, kw = sets(0.25)
    plain, adjusted = _estimate(s, c, kw, adjust=False), _estimate(s, c, kw)
    assert adjusted["adjustment"]["coef"][0] == pytest.approx(-0.8, abs=0.1)  # the difficulty it took out
    assert adjusted["test"]["p"] < 0.01 < plain["test"]["p"]  # measured: 2e-4 against 0.09
    assert abs(adjusted["estimate"] - member.mean()) < abs(plain["estimate"] - member.mean())
    s, c, _, kw = sets(0.0)
    out = _estimate(s, c, kw)
    assert stats.kstest(out["per_task"]["p"], "uniform").pvalue > 0.01 and not out["detected"]


def test_a_valid_control_lets_an_agreeing_share_stand_and_vetoes_a_contradicting_one():
    """Control tasks the benchmark's kind, but too few to pin the share: a strong leak's
    self-calibrated share that agrees with the control's interval is printed; a '0%' from an
    assumed null, below the control's lower bound, is not."""
    rng = np.random.default_rng(6)
    s, c, _, kw = _sets(rng, n=110, m=55, members=0.25, shift=6.0)
    ctl = _estimate(s, c, kw)
    assert ctl["detected"] and not ctl["usable"] and ctl["lower_bound"] > 0.05
    agree = {"usable": True, "estimate": 0.25, "ci": [0.18, 0.32], "per_task": {"flagged": np.ones(len(s), bool)}}
    d = audit_routes.decide(agree, None, "auto", control_result=ctl)
    assert d["route"] == "self-calibrated" and d["estimate"] == 0.25 and "control_check" in d
    assert audit_routes.flags_of(d, agree, None, len(s), ctl).all()  # the printing route's own flags
    zero = {"usable": True, "estimate": 0.0, "ci": [0.0, 0.03]}
    d = audit_routes.decide(zero, None, "auto", control_result=ctl)
    assert d["route"] is None and "self-calibrated route's 0.0% (0.0%–3.0%) disagrees" in d["statement"]
    none = audit_routes.decide(zero, None, "control")
    assert none["route"] is None and "needs control tasks" in none["statement"]
