"""`leakray audit --plan`: the requests an audit will send its target, counted before it runs, are
the requests it sends (a collection through the local endpoint server, every pass switched on)."""

import json

import pyarrow as pa
import pytest

from leakray.schema import C, T

PROMPT_A = 'def add(a, b):\n    """Return a + b."""\n'
PROMPT_B = 'def first(xs):\n    """The first item of xs, or None."""\n'


def _tasks() -> list[dict]:
    rows = [("a", PROMPT_A, PROMPT_A + "    return a + b\n"),
            ("b", PROMPT_B, PROMPT_B + "    if not xs:\n        return None\n    return xs[0]\n"),
            ("empty", PROMPT_A, PROMPT_A)]  # no continuation: nothing to score, nothing to cut
    return [{T.TASK_ID: tid, T.BENCHMARK: "toy", T.LANGUAGE: "python", T.PROMPT: p, T.REFERENCE: r,
             T.TESTS: "", T.RUNNER: "python"} for tid, p, r in rows]


def test_the_plan_counts_every_request_a_collection_sends(tiny_lm):
    from leakray.features.probes import PROBES
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.models.sampler import SampleConfig
    from leakray.stages.collect import finalize, input_table
    from leakray.stages.sample import ExtraColumns, SampleStage
    from leakray.stages.request_plan import collection_requests

    tasks = _tasks()
    # AdvPrompt's slots as the perturb stage leaves them: some proved, some empty
    adv = [[PROMPT_A, PROMPT_A.replace("add", "plus"), ""], [PROMPT_B, "", PROMPT_B.upper()], [PROMPT_A, "", ""]]
    table = input_table(tasks, {}, set()).append_column(C.ADV_PROMPTS, pa.array(adv, pa.list_(pa.string())))
    # more draws per cut than one request takes: each cut goes out as several requests
    extra = ExtraColumns(upper_case=True, advprompt=True, probes=PROBES, probe_tokens=6, next_cuts=3, next_draws=5)
    with CompletionServer(HFBackend(str(tiny_lm[0]))) as srv:
        sample = SampleConfig(backend="openai", endpoint_url=srv.url, k=2, max_new_tokens=10, max_n=2,
                              max_retries=0, row_retries=0)
        got = finalize(SampleStage(str(tiny_lm[0]), sample, extra)(table))
        bodies = list(srv.requests)
    assert got.num_rows == 3 and not any(n.startswith("failed") for ns in got.column(C.NOTES).to_pylist() for n in ns)
    plan = collection_requests(tasks, sample, extra, adv)
    parts = {p.name: p for p in plan.parts}
    assert set(parts) == {"samples", "reference scores (echo)", "upper-cased prompt", "AdvPrompt variants",
                          *(f"probe: {p}" for p in PROBES)}
    echo = [b for b in bodies if b.get("echo")]
    draws = [b for b in bodies if b.get("temperature") == 1.0 and b.get("max_tokens") == 1]
    assert len(echo) == parts["reference scores (echo)"].requests == 2  # the empty continuation is not scored
    assert len(draws) == sum(parts[f"probe: {p}"].requests for p in ("next", "question"))
    assert all(b["n"] <= 2 for b in draws) and sum(b["n"] for b in draws) == \
        sum(parts[f"probe: {p}"].choices for p in ("next", "question"))
    assert parts["AdvPrompt variants"].requests == 5  # the proved slots only (2 + 2 + 1)
    total = plan.total
    assert len(bodies) == total.requests and sum(b.get("n", 1) for b in bodies) == total.choices
    assert sum(b.get("n", 1) * b["max_tokens"] for b in bodies if not b.get("echo")) == total.max_tokens
    assert sum(len(b["prompt"]) for b in bodies) == total.characters
    assert not plan.bound  # every count exact here

    # without the proved variants (a plan made before the perturb stage ran): every slot, said so
    bound = collection_requests(tasks, sample, extra, None)
    from leakray.perturb.core import SLOTS

    assert {p.name: p.requests for p in bound.parts}["AdvPrompt variants"] == 3 * (1 + len(SLOTS))
    assert len(bound.bound) == 1 and bound.bound[0].startswith("AdvPrompt variants")
    one_kind = collection_requests(tasks, sample, extra, None, advprompt_kinds=("IDP",))
    assert {p.name: p.requests for p in one_kind.parts}["AdvPrompt variants"] == \
        3 * (1 + sum(1 for kind, _ in SLOTS if kind == "IDP"))


def test_the_plan_counts_what_a_collection_sends_through_the_chat_api(tiny_lm):
    """Through `/v1/chat/completions`: the texts inside messages, each answer's budget with its
    wrapper's room, no `echo` and no one-token draws, and the plan says what it leaves out."""
    from leakray.features.probes import PROBES
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.models.sampler import SampleConfig
    from leakray.stages.collect import finalize, input_table
    from leakray.stages.sample import ExtraColumns, SampleStage
    from leakray.stages.request_plan import collection_requests

    tasks = _tasks()
    extra = ExtraColumns(upper_case=True, probes=PROBES, probe_tokens=6, next_cuts=3, next_draws=5)
    with CompletionServer(HFBackend(str(tiny_lm[0]), chat_style="fenced")) as srv:
        sample = SampleConfig(backend="openai", endpoint_url=srv.url, k=2, max_new_tokens=10, max_retries=0,
                              row_retries=0, endpoint_api="chat", chat_extra_tokens=3)
        got = finalize(SampleStage(str(tiny_lm[0]), sample, extra)(input_table(tasks, {}, set())))
        bodies = list(srv.requests)
    assert got.num_rows == 3 and not any(n.startswith("failed") for ns in got.column(C.NOTES).to_pylist() for n in ns)
    assert got.column(C.NEXT_DRAWS).null_count == 3 and all("messages" in b for b in bodies)
    plan = collection_requests(tasks, sample, extra)
    assert {p.name for p in plan.parts} == {"samples", "upper-cased prompt", "probe: prefix", "probe: mask",
                                            "probe: greedy"}
    total = plan.total
    assert len(bodies) == total.requests and sum(b.get("n", 1) for b in bodies) == total.choices
    assert sum(b.get("n", 1) * b["max_tokens"] for b in bodies) == total.max_tokens
    assert sum(len(m["content"]) for b in bodies for m in b["messages"]) == total.characters
    assert len(plan.notes) == 1 and "next and question probes" in plan.notes[0]


def test_the_rewrite_test_and_the_control_route_send_what_the_plan_counts(tiny_lm):
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.models.sampler import SampleConfig
    from leakray.protocols.audit_plan import control_requests, rewrite_requests
    from leakray.protocols.control_scores import control_scores
    from leakray.parts import timed
    from leakray.protocols.rewrite_scores import rewrite_scores, scoring_parts

    summing = 'def total(xs):\n    """The sum of xs."""\n'
    tasks = [*_tasks(), {**_tasks()[0], T.TASK_ID: "sum", T.PROMPT: summing,
                         T.REFERENCE: summing + "    s = 0\n    for x in xs:\n        s += x\n    return s\n"}]
    model = str(tiny_lm[0])
    with CompletionServer(HFBackend(model)) as srv:
        sample = SampleConfig(backend="openai", endpoint_url=srv.url, k=1, max_new_tokens=8, max_retries=0)
        rewritten, rewrite_clock = timed(rewrite_scores, tasks, "served", sample, model, 3, 0)
        after_rewrites = list(srv.requests)
        _, control_clock = timed(control_scores, tasks[:2], tasks[2:], "served", sample, model)
        after_control = list(srv.requests)[len(after_rewrites):]
    assert max(rewritten.column("n_rewrites").to_pylist()) > 0  # the summing task has locals to rename
    for part, bodies in ((rewrite_requests(tasks, 3, 0), after_rewrites),
                         (control_requests(tasks[:2], tasks[2:]), after_control)):
        assert all(b.get("echo") for b in bodies)
        assert part.requests == len(bodies) > 0 and part.characters == sum(len(b["prompt"]) for b in bodies)
    # each stage's parts (leakray.parts): both models' load and score, the rewrites' making; each model
    # scores every text: each rewritten task's original and its rewrites, each task of both sets
    texts = sum(r["n_rewrites"] + 1 for r in rewritten.to_pylist() if r["target_original"] == r["target_original"])
    for clocked, n, made in ((rewrite_clock, texts, {"rewrite"}), (control_clock, len(tasks), set())):
        assert set(clocked["seconds"]) == made | {f"{p}_{role}" for p in ("load", "score") for role in ("target", "reference")}
        assert clocked["counts"] == {"score_target": n, "score_reference": n}
        marker = scoring_parts(clocked)
        assert set(marker["part_seconds"]) == set(clocked["seconds"])
        assert all(v > 0 for v in marker["throughput"].values()) and len(marker["throughput"]) == 2


def test_audit_plan_adds_the_check_the_rewrite_test_and_the_control_route(tmp_path):
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.perturb.rewrite import solution_rewrites
    from leakray.protocols.audit_plan import audit_requests, plan_lines

    control = tmp_path / "control.jsonl"
    control.write_text("".join(json.dumps({  # HumanEval's own format, as its reader takes it
        "task_id": f"Fresh/{i}", "prompt": f'def f{i}(x):\n    """x plus {i}."""\n',
        "canonical_solution": f"    return x + {i}\n", "entry_point": f"f{i}",
        "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n"}) + "\n" for i in range(5)))
    cfg = load_config([AUDIT_DEFAULTS], ["audit.target=served", "sample.backend=openai",
                                         "sample.endpoint_url=http://localhost:9/v1", "audit.rewrites=4",
                                         f"audit.control=humaneval={control}"], AuditConfig)
    tasks = _tasks()
    plan = audit_requests(cfg, tasks)
    parts = {p.name: p for p in plan.parts}
    assert plan.parts[0].name == "endpoint check" and parts["endpoint check"].requests == 1
    rewrites = [solution_rewrites(t[T.PROMPT], t[T.REFERENCE], t[T.TESTS], 4, cfg.audit.rewrite_seed, t[T.TASK_ID])
                for t in tasks]
    # the original and each rewrite, scored where the task has something to score
    assert parts["rewrite test (echo)"].requests == sum(1 + len(r) for r, t in zip(rewrites, tasks)
                                                        if not isinstance(r, str) and t[T.PROMPT] != t[T.REFERENCE])
    assert parts["control route (echo)"].requests == 2 + 5  # two benchmark tasks have a continuation
    text = "\n".join(plan_lines(cfg, plan))
    assert "http://localhost:9/v1" in text and f"{plan.total.requests:,}" in text and "nothing is sent" not in text


def test_plan_flag_prints_and_runs_nothing(tmp_path, capsys):
    from leakray.cli import main

    out = tmp_path / "runs"
    assert main(["audit", "--quick", "--plan", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "What this audit of 32 tasks will ask of the target, served here (hf): nothing is sent" in text
    assert "samples" in text and "total" in text and "endpoint check" not in text and not out.exists()
    with pytest.raises(SystemExit):  # card build has no target to plan for
        main(["card", "build", "--plan"])


def test_an_endpoint_audit_over_its_request_budget_is_refused_before_it_asks(tmp_path, capsys):
    """`audit.max_requests`: the plan is said before anything is sent, and an audit whose plan asks
    more is refused with the largest part named; the cap is a budget, not an input (the run's
    hash does not change with it)."""
    from leakray.cli import main
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config

    out = tmp_path / "runs"
    endpoint = ["--target", "served", "--set", "sample.backend=openai", "--set", "sample.endpoint_url=http://127.0.0.1:9/v1",
                "--quick", "--output", str(out)]
    assert main(["audit", *endpoint, "--set", "audit.max_requests=100"]) == 2
    err = capsys.readouterr()
    assert "this audit will ask the endpoint" in err.out
    assert "more than audit.max_requests=100" in err.err and "probe: question" in err.err
    assert not list(out.glob("*/collect_target")) and not list(out.glob("*/shadow"))  # nothing ran
    same = [load_config([AUDIT_DEFAULTS], [f"audit.max_requests={n}"] if n else [], AuditConfig).hashed()
            for n in (None, 100)]
    assert same[0] == same[1]
