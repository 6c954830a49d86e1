"""A target served only as a chat (`sample.endpoint_api=chat`): the continuation read out of a chat
answer, and a collection through the chat API against the same model through the completions API
(the local server plays a chat model that continues what it is asked to, in each answer style)."""

from __future__ import annotations

import math

import pytest
from test_endpoint_sampler import PROMPTS, _cfg, _run
from test_probes import SEEN_P, SEEN_R, TOY_DETECTORS, _probe_collection, memorised  # noqa: F401 (a fixture)

from leakray.detect import registry
from leakray.detect.base import collection_access
from leakray.features import probes as pr
from leakray.models import chat
from leakray.models.endpoint_sampler import REF_LOSS_UNSUPPORTED, EndpointSampler
from leakray.models.endpoint_server import CHAT_STYLES, CompletionServer, HFBackend
from leakray.schema import C

GIVEN = 'def add_one(x):\n    """Return x plus one."""\n'
CUT = 'def add_one(x):\n    """Return x plus one."""\n    return x +'  # a probe's cut inside a line


@pytest.mark.parametrize("given, answer, want, notes", [
    (GIVEN, "    return x + 1\n", "    return x + 1\n", []),
    (GIVEN, "```python\n    return x + 1\n```\nThis adds one.", "    return x + 1", [chat.FENCED]),
    (GIVEN, "Sure! Here it is:\n```\n    return x + 1\n```", "    return x + 1", [chat.FENCED, chat.PROSE]),
    (GIVEN, "```python\n" + GIVEN + "    return x + 1\n```", "    return x + 1", [chat.FENCED, chat.REPEATED]),
    # written out again from the signature, trailing spaces aside
    (GIVEN, 'def add_one(x):  \n    """Return x plus one."""\n    return x + 1\n', "    return x + 1\n",
     [chat.REPEATED]),
    # the given text stops mid-line: the answer writes that line whole
    (CUT, "```py\n    return x + 1\n```", " 1", [chat.FENCED, chat.REPEATED]),
    (CUT, " 1\n", " 1\n", []),
    # cut short before its closing fence: the rest of the answer
    (GIVEN, "```python\n    total = x\n    total", "    total = x\n    total", [chat.FENCED]),
    # the given text's last line is too short to be told from a fresh line: not a repeat
    ("x = [\n", "1, 2]\n", "1, 2]\n", []),
    (GIVEN, "", "", []),
])
def test_the_continuation_is_read_out_of_a_chat_answer(given, answer, want, notes):
    start, end, undone = chat.continuation_span(given, answer)
    assert answer[start:end] == want and undone == notes


def test_the_request_asks_for_the_text_and_a_server_reads_it_back():
    msgs = chat.messages(CUT)
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"].endswith(CUT)
    assert chat.given_of(msgs) == CUT
    with pytest.raises(ValueError):
        chat.given_of([{"role": "system", "content": "x"}])


def test_logprobs_cover_the_continuation_only():
    values, offsets = chat.token_logprobs({"logprobs": {"content": [
        {"token": "```python\n", "logprob": 0.0}, {"token": "    return", "logprob": -1.0},
        {"token": " x", "logprob": -2.0}, {"token": "\n```", "logprob": 0.0}]}})
    answer = "```python\n    return x\n```"
    start, end, _ = chat.continuation_span("def f(x):\n", answer)
    assert answer[start:end] == "    return x"
    assert [values[j] for j in chat.covering(offsets, start, end, len(answer))] == [-1.0, -2.0]
    assert chat.token_logprobs({"logprobs": None}) is None
    with pytest.raises(ValueError):
        chat.token_logprobs({"logprobs": {"content": [{"token": "x"}]}})


@pytest.fixture(scope="module")
def backends(tiny_lm):
    return {style: HFBackend(str(tiny_lm[0]), chat_style=style) for style in CHAT_STYLES}


@pytest.mark.parametrize("style", sorted(CHAT_STYLES))
def test_chat_samples_are_the_completions_samples(backends, style):
    """The same model, seed and budget through either API: the same cut completions, token counts
    and perplexities, whatever the chat answer wraps them in (the budget covers its wrapper)."""
    wrapper = sum(1 for piece in CHAT_STYLES[style][:2] if piece)
    with CompletionServer(backends[style]) as srv:
        plain = _run(EndpointSampler("tiny", _cfg(srv.url)))
        sampler = EndpointSampler("tiny", _cfg(srv.url, endpoint_api="chat", chat_extra_tokens=wrapper))
        sampler.check()
        chatted = _run(sampler)
        probes = sampler.greedy_probe([CUT], ["python"], ["t/cut"], 16)
        assert probes == EndpointSampler("tiny", _cfg(srv.url)).greedy_probe([CUT], ["python"], ["t/cut"], 16)
        chat_bodies = [b for b in srv.requests if "messages" in b]
    assert [s.completions for s in chatted] == [s.completions for s in plain]
    assert [s.n_tokens for s in chatted] == [s.n_tokens for s in plain]
    for a, b in zip(chatted, plain):
        assert a.perplexity == pytest.approx(b.perplexity, rel=1e-6)
        assert all(math.isfinite(p) for p in a.perplexity)
    assert all("stop" not in b and "prompt" not in b for b in chat_bodies)  # the cut is made here
    assert {b["max_tokens"] for b in chat_bodies if b.get("n") == 3} == {24 + wrapper}
    if style == "prose_repeat":
        assert all({chat.FENCED, chat.PROSE, chat.REPEATED} <= set(s.notes) for s in chatted)
    assert sampler.settings.completions_url.endswith("/v1/chat/completions")


def test_a_chat_endpoint_scores_no_given_text_and_draws_no_token(backends):
    with CompletionServer(backends["fenced"]) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, endpoint_api="chat", chat_extra_tokens=1))
        scores = sampler.reference_scores([p for p, _, _ in PROMPTS], [p + "    return 1\n" for p, _, _ in PROMPTS])
        assert not srv.requests  # never asked: a chat API has no echo
        assert all(math.isnan(s.loss) and REF_LOSS_UNSUPPORTED in s.notes for s in scores)
        assert not sampler.draws_tokens
        with pytest.raises(RuntimeError, match="chat_api_draws_no_next_token"):
            sampler.next_token_draws(["def f("], ["k"], 4)


def test_a_chat_endpoint_that_refuses_logprobs_still_gives_completions(tiny_lm):
    with CompletionServer(HFBackend(str(tiny_lm[0]), no_logprobs="refuse", chat_style="fenced")) as srv:
        out = _run(EndpointSampler("tiny", _cfg(srv.url, endpoint_api="chat", chat_extra_tokens=1)))
        refused = srv.count(lambda body: bool(body.get("logprobs")))
    assert all(s.completions and all(math.isnan(p) for p in s.perplexity) for s in out)
    assert refused <= 3  # learnt once: each prompt's first request at most (they go out together)


def test_a_chat_server_that_wants_max_completion_tokens_gets_it(backends, tiny_lm):
    """Newer OpenAI models refuse `max_tokens` for `max_completion_tokens`: the check learns it,
    and the samples are those of a server that takes `max_tokens`."""
    with CompletionServer(backends["fenced"]) as srv:
        want = _run(EndpointSampler("tiny", _cfg(srv.url, endpoint_api="chat", chat_extra_tokens=1)))
    with CompletionServer(HFBackend(str(tiny_lm[0]), chat_style="fenced",
                                    chat_budget_key="max_completion_tokens")) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, endpoint_api="chat", chat_extra_tokens=1))
        sampler.check()
        got = _run(sampler)
        bodies = list(srv.requests)
    assert [s.completions for s in got] == [s.completions for s in want]
    assert len(bodies) == 2 + len(PROMPTS) and "max_tokens" in bodies[0]  # one refusal, in the check
    assert all("max_tokens" not in b and b["max_completion_tokens"] for b in bodies[1:])


def test_probes_through_a_chat_endpoint(memorised):
    """A collection with every probe through the chat API: the text probes read what the
    completions API gives them, the one-token draws are not asked for (their columns stay empty),
    the reference is not scored, and each text probe still ranks the memorised task first."""
    from leakray.models.sampler import SampleConfig

    def collect(server_style: str, **api):
        with CompletionServer(HFBackend(memorised, chat_style=server_style)) as srv:
            table = _probe_collection(memorised, SampleConfig(backend="openai", endpoint_url=srv.url, k=1,
                                                              max_new_tokens=48, max_retries=0, **api))
            return table, list(srv.requests)

    plain, _ = collect("plain")
    chatted, bodies = collect("prose_repeat", endpoint_api="chat", chat_extra_tokens=2)
    assert all("messages" in b for b in bodies) and not any(b.get("max_tokens") == 1 and b.get("n", 1) > 1
                                                            for b in bodies)
    assert collection_access(chatted) == "sampled logprobs"
    for col in (C.COMPLETIONS, C.PREFIX_CUTS, C.PREFIX_COMPLETIONS, C.MASK_SPANS, C.MASK_COMPLETIONS,
                C.GREEDY_COMPLETION, C.REWRITES):
        assert chatted.column(col).to_pylist() == plain.column(col).to_pylist(), col
    for col in (C.NEXT_CUTS, C.NEXT_DRAWS, C.QUESTION_CUTS, C.QUESTION_DRAWS, C.REF_TOKEN_LOGPROBS):
        assert chatted.column(col).null_count == chatted.num_rows, col
    assert chatted.column(C.TASK_ID).to_pylist() == ["seen", "unseen"]
    for name in (n for n in TOY_DETECTORS if n not in ("next_token", "question_next_token")):
        seen, unseen = registry.make(name).score(chatted)
        assert seen > unseen, (name, seen, unseen)
    assert pr.prefix_cuts(SEEN_P, SEEN_R) == chatted.column(C.PREFIX_CUTS).to_pylist()[0]
    # how the model answered is counted apart from what went wrong with a row
    import pyarrow as pa

    from leakray.stages.collect import collection_stats

    for col, typ in ((C.EXEC_STATUS, pa.string()), (C.N_TOKENS, pa.int32())):
        chatted = chatted.set_column(chatted.schema.get_field_index(col), col, pa.array([[]] * 2, pa.list_(typ)))
    stats = collection_stats(chatted, 1.0)
    assert stats["chat_answers"] == {chat.FENCED: 2, chat.PROSE: 2, chat.REPEATED: 2}
    assert not any(k.startswith("chat_answer") for k in stats["errors"])


def test_the_report_says_the_target_was_read_through_a_chat_api():
    """report.md's access line and the page's access card: the API, and how many rows' answers
    needed their wrapping taken off."""
    from types import SimpleNamespace as NS

    from leakray.report import html as rh
    from leakray.report.audit import chat_api
    from leakray.report.audit_markdown import chat_words

    collected = {"rows_out": 4, "chat_answers": {chat.FENCED: 2, chat.REPEATED: 1}}  # the stage's stats
    cfg = NS(sample=NS(backend="openai", endpoint_api="chat"))
    got = chat_api(cfg, collected)
    assert got == {"rows": 4, "answers": {chat.FENCED: 2, chat.PROSE: 0, chat.REPEATED: 1}}
    assert chat_api(NS(sample=NS(backend="openai", endpoint_api="completions")), collected) is None
    assert "rows whose answers were fenced 2, opened with a sentence 0, wrote the given code out again 1, of 4" \
        in chat_words(got)
    page = rh.render_audit({"summary": {"access": "sampled logprobs", "detectors_run": ["gt_match", "cdd"],
                                        "chat_api": got}}, [])
    assert "detectors run: gt_match, cdd" in page and "through a chat API (4 rows; answers fenced 2" in page
