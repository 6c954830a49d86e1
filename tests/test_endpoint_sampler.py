"""The OpenAI-compatible endpoint sampler against a local server speaking the protocol with
the tiny HF model's real output, faults injected per request."""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import dataclass

import pytest

from leakray.data.tasks import generation_prompt
from leakray.models.endpoint_sampler import (FAILED, NO_LOGPROBS, REF_LOSS_UNSUPPORTED, EndpointSampler,
                                             failed_reason)
from leakray.models.endpoint_server import CompletionServer, HFBackend, ReplayBackend
from leakray.models.offline import EOS
from leakray.models.sampler import SampleConfig, task_seed, tokens_covering
from leakray.models.stops import cut_point

PY_BODY = 'def add_one(x):\n    """Return x plus one."""\n'
PY_MODULE = '"""Write a function that returns the largest of a list of numbers."""\n'
JAVA_BODY = "class Solution {\n    public int addOne(int x) {\n"
PROMPTS = [(PY_BODY, "python", "t/0"), (PY_MODULE, "python", "t/1"), (JAVA_BODY, "java", "t/2")]
REFERENCES = [PY_BODY + "    return x + 1\n", "def largest(xs):\n    return max(xs)\n",
              JAVA_BODY + "        return x + 1;\n    }\n}\n"]


@dataclass
class EndpointConfig(SampleConfig):
    """SampleConfig with the endpoint fields (the sampler reads them with defaults either way)."""

    endpoint_url: str = ""
    endpoint_model: str = ""
    api_key_env: str = "LEAKRAY_TEST_NO_KEY"
    concurrency: int = 4
    timeout_s: float = 20.0
    max_retries: int = 3
    backoff_s: float = 0.01


def _cfg(url: str, **kw) -> EndpointConfig:
    return EndpointConfig(**{"backend": "openai", "k": 3, "max_new_tokens": 24, "temperature": 1.0,
                             "top_p": 0.95, "seed": 7, "endpoint_url": url, **kw})


def _run(sampler, rows=PROMPTS):
    prompts, langs, keys = (list(col) for col in zip(*rows))
    return sampler.sample(prompts, langs, keys)


@pytest.fixture(scope="module")
def backend(tiny_lm):
    return HFBackend(str(tiny_lm[0]))


def _hf_reference(backend, prompt, lang, k, seed, max_new, temperature, top_p, stops):
    """What the HF model itself gives for this seed, cut as the HF sampler cuts (generation
    stops at a stop string, which stays in the raw text; perplexity over the kept tokens)."""
    import torch

    tok, model = backend.tok, backend.model
    torch.manual_seed(seed)
    ids = tok(generation_prompt(prompt), return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new,
                             num_return_sequences=k, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=tok.pad_token_id)
    new = gen.sequences[:, ids.shape[1]:]
    lps = torch.log_softmax(torch.stack(gen.logits, dim=1).float(), -1).gather(-1, new[..., None]).squeeze(-1)
    special = set(tok.all_special_ids)
    texts, ppls, counts = [], [], []
    for s in range(k):
        seq = new[s].tolist()
        seq = seq[: next((j for j, t in enumerate(seq) if t in special), len(seq))]
        raw = tok.decode(seq, skip_special_tokens=True)
        hits = [raw.find(st) + len(st) for st in stops if st in raw]
        if hits:  # generation would have stopped right after the first stop string
            raw = raw[: min(hits)]
            seq = seq[: tokens_covering(tok, seq, len(raw))]
        cut = cut_point(prompt, raw, lang)
        n = max(1, tokens_covering(tok, seq, cut) if seq else 1)
        texts.append(raw[:cut].rstrip() + "\n")
        ppls.append(math.exp(-lps[s, :n].mean().item()))
        counts.append(len(seq[:n]))
    return texts, ppls, counts


def test_completions_and_perplexities_match_the_model(backend):
    with CompletionServer(backend) as srv:
        cfg = _cfg(srv.url)
        sampler = EndpointSampler("tiny", cfg)
        out = _run(sampler)
    assert len(srv.requests) == len(PROMPTS)  # one request per prompt, n=k
    for (prompt, lang, key), got in zip(PROMPTS, out):
        body = next(b for b in srv.requests if b["prompt"] == generation_prompt(prompt))
        assert body["n"] == cfg.k and body["seed"] == task_seed(cfg.seed, key) and body["logprobs"] == 1
        texts, ppls, counts = _hf_reference(backend, prompt, lang, cfg.k, body["seed"], cfg.max_new_tokens,
                                            cfg.temperature, cfg.top_p, body.get("stop", []))
        assert got.completions == texts
        assert got.n_tokens == counts
        assert got.perplexity == pytest.approx(ppls, rel=1e-4)
        assert all(math.isfinite(p) and p >= 1 for p in got.perplexity)
        assert got.notes == []
    # Java's closing brace is part of the unit: not sent as a stop (the server would drop it)
    java = next(b for b in srv.requests if b["prompt"] == generation_prompt(JAVA_BODY))
    assert "stop" not in java
    assert next(b for b in srv.requests if b["prompt"] == generation_prompt(PY_BODY))["stop"]


# completions served as if sampled (scored by the model): each one is cut somewhere else
FORCED = {
    PY_BODY: [("\n    return x + 1\n\n# helper\ndef other():\n    pass\n", "\n    return x + 1\n"),  # a stop
              ("\n    y = x + 1\n    return y" + EOS, "\n    y = x + 1\n    return y\n"),  # EOS
              ("\n    return x + 1\nx = add_one(2)\nprint(x)\n", "\n    return x + 1\n")],  # no stop at the cut
    PY_MODULE: [('\ndef largest(xs):\n    return max(xs)\n"""Next task."""\n',
                 "\ndef largest(xs):\n    return max(xs)\n")],
    JAVA_BODY: [("\n        return x + 1;\n    }\n}\nclass Other {}\n", "\n        return x + 1;\n    }\n}\n")],
}


def _forced_reference(backend, prompt, lang, text, stops):
    """The HF sampler's cut and perplexity for a completion it had sampled as `text`."""
    import torch

    tok = backend.tok
    ids, seq = tok(generation_prompt(prompt))["input_ids"], tok(text)["input_ids"]
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([ids + seq])).logits[0, len(ids) - 1: -1]
    lps = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(seq)[:, None]).squeeze(-1)
    generated = len(seq)
    seq = seq[: next((j for j, t in enumerate(seq) if t in set(tok.all_special_ids)), len(seq))]
    raw = tok.decode(seq)
    hits = [raw.find(st) + len(st) for st in stops if st in raw]
    if hits:
        raw = raw[: min(hits)]
        seq = seq[: tokens_covering(tok, seq, len(raw))]
    cut = cut_point(prompt, raw, lang)
    n = max(1, tokens_covering(tok, seq, cut))
    return raw[:cut].rstrip() + "\n", math.exp(-lps[:n].mean().item()), n, generated


def test_cuts_stops_and_eos_count_the_kept_tokens_only(tiny_lm):
    forced = {generation_prompt(p): [text for text, _ in texts] for p, texts in FORCED.items()}
    backend = HFBackend(str(tiny_lm[0]), forced=forced)
    with CompletionServer(backend) as srv:
        out = _run(EndpointSampler("tiny", _cfg(srv.url, max_new_tokens=64)))
    for (prompt, lang, _), got in zip(PROMPTS, out):
        stops = next(b for b in srv.requests if b["prompt"] == generation_prompt(prompt)).get("stop", [])
        texts = FORCED[prompt] * 3
        assert got.completions == [want for _, want in texts[:3]]
        for (text, _), ppl, count in zip(texts, got.perplexity, got.n_tokens):
            want_text, want_ppl, want_n, generated = _forced_reference(backend, prompt, lang, text, stops)
            assert count == want_n < generated  # the cut (or EOS) left tokens out
            assert ppl == pytest.approx(want_ppl, rel=1e-5)


def test_same_task_same_output_whatever_the_batch(backend):
    with CompletionServer(backend) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, concurrency=2))
        first = {key: s.completions for (_, _, key), s in zip(PROMPTS, _run(sampler))}
        again = {key: s.completions for (_, _, key), s in zip(PROMPTS[::-1][:2], _run(sampler, PROMPTS[::-1][:2]))}
    assert all(again[key] == first[key] for key in again)
    assert len({b["seed"] for b in srv.requests}) == len(PROMPTS)


def test_reference_loss_matches_the_hf_sampler(tiny_lm, backend):
    from leakray.models.hf_sampler import HFSampler

    prompts = [p for p, _, _ in PROMPTS] + [PY_BODY]
    refs = REFERENCES + [PY_BODY]  # nothing after the prompt: NaN, no request
    want = HFSampler(str(tiny_lm[0]), SampleConfig(threads=1)).reference_loss(prompts, refs)
    with CompletionServer(backend) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url))
        got = sampler.reference_loss(prompts, refs)
    assert len(srv.requests) == 3 and all(b["echo"] and b["max_tokens"] == 0 for b in srv.requests)
    assert all(math.isfinite(v) for v in got[:3]) and math.isnan(got[3])
    assert got == pytest.approx(want, abs=1e-4, nan_ok=True)
    assert sampler.loss_notes == [[], [], [], ["ref_loss_no_continuation"]]


def test_retries_429_500_and_timeouts_then_the_same_output(backend):
    script = ["429:1", "500", "sleep:2.5"]  # per prompt, in order; then served normally
    seen: dict[str, int] = {}

    def fault(body, _count):
        i = seen[body["prompt"]] = seen.get(body["prompt"], 0) + 1
        return script[i - 1] if i <= len(script) else None

    rows = PROMPTS[:2]
    with CompletionServer(backend) as srv:
        clean = _run(EndpointSampler("tiny", _cfg(srv.url)), rows)
    with CompletionServer(backend, fault=fault) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, timeout_s=1.0))
        t0 = time.monotonic()
        out = _run(sampler, rows)
        elapsed = time.monotonic() - t0
    assert [s.completions for s in out] == [s.completions for s in clean]
    assert [p for s in out for p in s.perplexity] == pytest.approx([p for s in clean for p in s.perplexity])
    assert sampler.stats["retry_http_429"] == 2 and sampler.stats["retry_http_500"] == 2
    assert sampler.stats["retry_timeout"] == 2 and sampler.stats["retries"] == 6
    assert sampler.stats["requests"] == 8 and sampler.stats["failed_rows"] == 0
    assert elapsed >= 2.0  # Retry-After: 1 honoured, then a 1 s timeout


@pytest.mark.parametrize("fault,reason", [("garbage", "malformed_json"), ("no_choices", "malformed_json"),
                                          ("500", "http_500"), ("drop", "connection")])
def test_a_prompt_that_always_fails_fails_alone(backend, fault, reason):
    broken = generation_prompt(PY_MODULE)
    with CompletionServer(backend, fault=lambda body, _: fault if body["prompt"] == broken else None) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, max_retries=2))
        out = _run(sampler)
    bad = out[1]
    assert bad.completions == [] and bad.perplexity == [] and bad.notes == [FAILED + reason]
    assert failed_reason(bad) == reason
    assert srv.count(lambda b: b["prompt"] == broken) == 3  # first try + max_retries
    for good in (out[0], out[2]):
        assert len(good.completions) == 3 and failed_reason(good) is None
        assert all(math.isfinite(p) for p in good.perplexity)
    assert sampler.stats["failed_rows"] == 1


def test_a_refusal_is_not_retried(backend):
    with CompletionServer(backend, fault=lambda body, _: "400") as srv:
        out = _run(EndpointSampler("tiny", _cfg(srv.url)), PROMPTS[:1])
    assert out[0].notes == [FAILED + "http_400"] and len(srv.requests) == 1


@pytest.mark.parametrize("mode", ["ignore", "refuse"])
def test_a_target_without_logprobs_still_gives_completions(tiny_lm, mode):
    backend = HFBackend(str(tiny_lm[0]), no_logprobs=mode)
    with CompletionServer(backend) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url))
        out = _run(sampler)
        losses = sampler.reference_loss([p for p, _, _ in PROMPTS], REFERENCES)
    for s in out:
        assert len(s.completions) == 3 and all(c.strip() for c in s.completions)
        assert all(math.isnan(p) for p in s.perplexity)
        assert s.notes == [NO_LOGPROBS]
    assert all(math.isnan(v) for v in losses) and sampler.loss_notes == [[REF_LOSS_UNSUPPORTED]] * 3


def test_a_target_that_refuses_echo_is_asked_once(backend):
    """An API that returns its samples' log-probabilities but scores no given text: the samples keep
    their perplexities, the reference scores are NaN with the note, and after the first refusal
    no other row's echo is sent."""
    refuse = lambda body, _: "400:echo is not supported for this model" if body.get("echo") else None  # noqa: E731
    with CompletionServer(backend, fault=refuse) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, concurrency=1))
        out = _run(sampler)
        losses = sampler.reference_loss([p for p, _, _ in PROMPTS], REFERENCES)
        echoed = srv.count(lambda body: bool(body.get("echo")))
    assert all(math.isfinite(p) for s in out for p in s.perplexity) and not any(s.notes for s in out)
    assert all(math.isnan(v) for v in losses) and sampler.loss_notes == [[REF_LOSS_UNSUPPORTED]] * 3
    assert echoed == 1


def test_one_token_draws_come_from_the_models_distribution(backend):
    """The server's one-forward-pass path for n one-token samples (the next-token probes' request):
    the draws follow the model's next-token distribution, each reports its raw log-probability,
    temperature 0 and a tiny top-p give the argmax, and a seed gives the same draws again."""
    import torch

    prompt = generation_prompt(PY_BODY)
    ids = backend.tok(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        lp = torch.log_softmax(backend.model(input_ids=ids).logits[0, -1].float(), -1)

    def draws(**kw):
        body = {"prompt": prompt, "n": 2000, "max_tokens": 1, "logprobs": 1, "seed": 3, **kw}
        return [c["logprobs"] for c in backend.complete(body)["choices"]]

    got = draws(temperature=1.0, top_p=1.0)
    values = torch.tensor([d["token_logprobs"][0] for d in got])
    assert all(bool(torch.isclose(lp, v, atol=1e-5).any()) for v in values.unique())  # raw log-probs of tokens
    top = int(lp.argmax())
    share = float((values - lp[top]).abs().lt(1e-6).float().mean())
    assert abs(share - float(lp[top].exp())) < 0.04  # 2000 draws: about 4 standard errors
    assert values.unique().numel() > 3  # sampled, not the argmax every time
    assert draws(temperature=1.0, top_p=1.0) == got
    for greedy in (draws(temperature=0.0), draws(temperature=1.0, top_p=1e-6)):
        assert {d["token_logprobs"][0] for d in greedy} == {float(lp[top])}


def test_more_draws_than_a_request_takes_go_out_as_several(backend):
    """At most `sample.max_n` choices per request (OpenAI's completions cap n at 128): 10 draws at
    max_n 4 are three requests of 4, 4 and 2, each with its own seed; the first is the request
    that asking for 4 draws sends, so draws within the cap are what they always were."""
    texts = [generation_prompt(PY_BODY)]
    with CompletionServer(backend) as srv:
        split = EndpointSampler("tiny", _cfg(srv.url, max_n=4)).next_token_draws(texts, ["t/0"], 10)
        sent = [dict(b) for b in srv.requests]
        within = EndpointSampler("tiny", _cfg(srv.url, max_n=4)).next_token_draws(texts, ["t/0"], 4)
    assert [len(d) for d in split] == [10] and all(isinstance(x, str) for x in split[0])
    assert [b["n"] for b in sent] == [4, 4, 2] and len({b["seed"] for b in sent}) == 3
    assert split[0][:4] == within[0]


def test_concurrency_is_bounded(backend):
    with CompletionServer(backend) as srv:  # record one real answer per prompt, then replay it slowly
        sampler = EndpointSampler("tiny", _cfg(srv.url))
        _run(sampler, PROMPTS[:1])
    response = {"choices": [{"index": i, "text": "    return x + 1\n", "logprobs": None} for i in range(3)]}
    rows = [(PY_BODY + f"# {i}\n", "python", f"c/{i}") for i in range(12)]
    replay = ReplayBackend({generation_prompt(p): response for p, _, _ in rows})
    for limit in (1, 4):
        with CompletionServer(replay, latency_s=0.1) as srv:
            out = _run(EndpointSampler("tiny", _cfg(srv.url, concurrency=limit)), rows)
        assert srv.max_in_flight == limit
        assert all(s.completions == ["    return x + 1\n"] * 3 for s in out)


def test_the_api_key_is_sent_and_never_written(backend, monkeypatch, caplog, capsys):
    key = "sk-leakray-" + secrets.token_hex(16)
    monkeypatch.setenv("LEAKRAY_TEST_KEY", key)
    caplog.set_level(logging.DEBUG)  # every logger, urllib3's connection logs included
    broken = generation_prompt(PY_MODULE)
    with CompletionServer(backend, api_key=key,
                          fault=lambda body, _: "garbage" if body["prompt"] == broken else None) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, api_key_env="LEAKRAY_TEST_KEY", max_retries=1))
        out = _run(sampler)
        sampler.reference_loss([p for p, _, _ in PROMPTS], REFERENCES)
    assert srv.auth_ok == len(srv.requests) > 0  # the key was used on every request
    with CompletionServer(backend, api_key=key, fault=lambda body, _: "400") as srv:
        out += _run(EndpointSampler("tiny", _cfg(srv.url, api_key_env="LEAKRAY_TEST_KEY")), PROMPTS[:1])
    closed = _cfg("http://127.0.0.1:9/v1", api_key_env="LEAKRAY_TEST_KEY", max_retries=1)
    out += _run(EndpointSampler("tiny", closed), PROMPTS[:1])  # connection refused
    assert [failed_reason(s) for s in out] == [None, "malformed_json", None, "http_400", "connection"]
    with pytest.raises(ValueError) as bad_url:
        EndpointSampler("tiny", _cfg("ftp://x", api_key_env="LEAKRAY_TEST_KEY"))
    captured = capsys.readouterr()
    written = [caplog.text, captured.out, captured.err, str(bad_url.value), repr(sampler),
               str(vars(sampler)), str(sampler.stats), str(sampler.settings), str(out)]
    assert "endpoint row" in caplog.text  # the failures were logged ...
    assert not any(key in text for text in written)  # ... without the key


def test_reference_loss_where_max_tokens_0_is_refused(backend):
    prompts = [p for p, _, _ in PROMPTS]
    with CompletionServer(backend) as srv:
        want = EndpointSampler("tiny", _cfg(srv.url)).reference_loss(prompts, REFERENCES)
    refuse_0 = "400:max_tokens must be at least 1"
    with CompletionServer(backend, fault=lambda body, _: refuse_0 if body["max_tokens"] == 0 else None) as srv:
        sampler = EndpointSampler("tiny", _cfg(srv.url, concurrency=1))
        got = sampler.reference_loss(prompts, REFERENCES)
    assert [b["max_tokens"] for b in srv.requests] == [0, 1, 1, 1]  # learnt once
    assert got == pytest.approx(want, abs=1e-6) and sampler.loss_notes == [[], [], []]


@pytest.mark.parametrize("fault,words", [
    ("401", ["http_401", "$LEAKRAY_TEST_NO_KEY"]), ("404:no such model", ["http_404 no such model", "model name"]),
    ("500", ["did not answer", "http_500", "after 2 retries"]), ("drop", ["did not answer", "connection"])])
def test_the_endpoint_check_says_what_the_endpoint_answered(backend, fault, words):
    from leakray.errors import BadInput

    with CompletionServer(backend, fault=lambda body, _: fault) as srv:
        with pytest.raises(BadInput) as err:
            EndpointSampler("tiny", _cfg(srv.url, max_retries=2)).check()
    assert all(w in str(err.value) for w in words), str(err.value)
    assert srv.url in str(err.value) and "'tiny'" in str(err.value)


def test_the_endpoint_check_passes_a_served_model_after_a_retry(backend):
    script = iter(["429"])
    with CompletionServer(backend, fault=lambda body, _: next(script, None)) as srv:
        EndpointSampler("tiny", _cfg(srv.url)).check()
        assert len(srv.requests) == 2
