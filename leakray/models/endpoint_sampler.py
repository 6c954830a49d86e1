"""Sampling from a black-box target behind an OpenAI-compatible `/v1/completions` endpoint
(a vLLM server, a commercial API), or `/v1/chat/completions` for a model served only as a chat
(`endpoint_api: chat`, `leakray.models.chat`: the model is asked to continue the text, and the
continuation is read out of its answer; no `echo`, so no reference scores, and no one-token draws).

One request per prompt with `n=k` and a seed derived from the task id (servers that honour
seeds, vLLM among them, then give a retried batch the same output), `logprobs=1` so the
perplexity is over the tokens the cut keeps: with each token's `text_offset`, the tokens
starting before the cut, as `tokens_covering` counts them for the HF sampler (stop strings
and EOS excluded; at least one token). vLLM reports raw (unwarped) log-probs by default;
what a commercial API reports is its own.

Requests run on a bounded thread pool (`concurrency`). 429, 408, 5xx, connection errors,
timeouts and malformed responses are retried with exponential backoff and jitter (a
Retry-After header wins), up to `max_retries`; after that, or on any other 4xx, the row
fails alone: empty completions and a note `endpoint_failed:<reason>` (`failed_reason`),
never an exception for the batch. A target without logprobs still yields completions,
with NaN perplexities, 0 tokens and the note `endpoint_no_logprobs`.

Stop strings: only those the cut ends at or before (not Java's closing brace), at most 4
(OpenAI's limit; they only save tokens). A server that names the matched one (vLLM's
`stop_reason`) gets it put back before the cut, so the text and token count are the HF
sampler's exactly; without it, comment lines just before a stop stay in the completion.

`reference_scores` asks for the echoed program's log-probs (`echo`, `max_tokens=0`, or 1
where a server refuses 0) and scores the tokens not wholly inside the generation prompt;
NaN with a note in `loss_notes` where the target scores no given text (asked once: after a
refusal the other rows are not sent) or refuses this one (`ref_loss_unscorable:http_400`, e.g.
longer than its context: the row keeps its samples); retries spent on it fail the row, as a
sampling request's do. An echo gives only
the scored tokens' own log-probs: Min-K%++'s mu/sigma and the rank are None with notes
(`reference_loss` is the scores' loss).

`sample(..., k=, greedy=)`: `k` overrides the config's n; greedy is temperature 0, one
completion unless `k` says otherwise.

The API key is read from the environment variable named by `api_key_env` at each request
and is never stored on the sampler, logged, or put in a note or an exception.
"""

from __future__ import annotations

import email.utils
import logging
import math
import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from leakray.data.tasks import continuation, generation_prompt, program_of
from leakray.models import chat
from leakray.models.sampler import (REF_LOSS_NO_CONTINUATION, RefScores, Samples, n_completions,
                                    scores_from_logprobs, task_seed)
from leakray.models.stops import cut_point, server_stops

log = logging.getLogger(__name__)

FAILED = "endpoint_failed:"  # prefix of the note on a row the endpoint never answered usably
NO_LOGPROBS = "endpoint_no_logprobs"
REF_LOSS_UNSUPPORTED = "ref_loss_unsupported"  # the target scores no given text (echo + logprobs)
REF_LOSS_REFUSED = "ref_loss_unscorable:"  # + the status: the target would not score this text
_MAX_STOPS = 4  # OpenAI's limit; stops only save tokens, the cut is `cut_point`'s
_MAX_WAIT_S = 300.0  # a Retry-After beyond this is capped (a sweep must move on)
_RETRY_STATUS = {408, 409, 429}


@dataclass(frozen=True)
class EndpointSettings:
    """The sampler-config fields this backend reads (defaults where the config lacks them)."""

    endpoint_url: str = ""  # base URL up to /v1 (".../v1/completions" also accepted)
    endpoint_model: str = ""  # the served model name; empty: the model given to the sampler
    api_key_env: str = "OPENAI_API_KEY"  # the variable's *name*; unset or empty: no Authorization
    concurrency: int = 8  # requests in flight
    timeout_s: float = 120.0  # per request (connect, and each read)
    max_retries: int = 5  # retries after the first try
    backoff_s: float = 1.0  # first retry waits ~this, doubling each time (with jitter)
    endpoint_api: str = "completions"  # or "chat": /v1/chat/completions (leakray.models.chat)
    chat_extra_tokens: int = 32  # chat: tokens added to each request's budget for fences and a preamble

    @classmethod
    def of(cls, cfg) -> EndpointSettings:
        s = cls(**{f.name: getattr(cfg, f.name, f.default) for f in fields(cls)})
        parts = urlsplit(s.endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"endpoint_url must be an http(s) URL, got {s.endpoint_url!r}")
        if s.concurrency < 1 or s.max_retries < 0 or s.timeout_s <= 0 or s.backoff_s < 0:
            raise ValueError("concurrency >= 1, max_retries >= 0, timeout_s > 0 and backoff_s >= 0 are required")
        if s.endpoint_api not in ("completions", "chat") or s.chat_extra_tokens < 0:
            raise ValueError(f"endpoint_api is completions or chat (got {s.endpoint_api!r}); chat_extra_tokens >= 0")
        return s

    @property
    def chat(self) -> bool:
        return self.endpoint_api == "chat"

    @property
    def completions_url(self) -> str:
        """Where requests go: the base URL (a full route given is taken back to its /v1) plus the
        API's route."""
        url = self.endpoint_url.rstrip("/")
        for route in ("/chat/completions", "/completions"):
            if url.endswith(route):
                url = url[: -len(route)]
                break
        return url + ("/chat/completions" if self.chat else "/completions")


def failed_reason(sample: Samples) -> str | None:
    """Why the endpoint gave this row nothing, or None for a row that has its completions."""
    return next((n[len(FAILED):] for n in getattr(sample, "notes", []) if n.startswith(FAILED)), None)


class ProbeFailed(RuntimeError):
    """A probe's request was never answered usably (retries spent, or refused); ``reason`` as in
    `failed_reason` (`http_429`, `timeout`, `http_400`...), which says whether another try can help."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.reason = reason


class _Malformed(ValueError):
    """A 200 response that is not the protocol (retryable: proxies and overloaded servers do this)."""


class _RowFailed(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Refused(Exception):
    """A 4xx that retrying will not change; `message` is the server's own words (no request data)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"http_{status}")
        self.status, self.message = status, message


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _choices(body, n: int) -> list[dict]:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise _Malformed("no choices")
    choices = sorted(body["choices"], key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
    if len(choices) != n or not all(isinstance(c, dict) and isinstance(c.get("text"), str) for c in choices):
        raise _Malformed(f"expected {n} choices with text")
    return choices


def _chat_choices(body, n: int) -> list[dict]:
    """A chat response's choices as completions choices: ``text`` is the message's content."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise _Malformed("no choices")
    choices = sorted(body["choices"], key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
    out = []
    for c in choices:
        message = c.get("message") if isinstance(c, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if content is None and isinstance(message, dict) and message.get("refusal"):
            content = ""  # a model that declines to answer: no continuation, not a malformed reply
        if not isinstance(content, str):
            raise _Malformed("a choice without message content")
        out.append({**c, "text": content})
    if len(out) != n:
        raise _Malformed(f"expected {n} choices")
    return out


def _token_logprobs(choice: dict) -> tuple[list, list[int]] | None:
    """(log-probs, start offsets relative to the first token), or None without logprobs."""
    lp = choice.get("logprobs")
    if lp is None or lp.get("token_logprobs") is None:
        return None
    values = lp["token_logprobs"]
    offsets = lp.get("text_offset")
    if offsets is None:  # offsets from the token strings (exact for byte-level BPE on ASCII)
        offsets, at = [], 0
        for token in lp.get("tokens") or []:
            offsets.append(at)
            at += len(token)
    if not isinstance(values, list) or not isinstance(offsets, list) or len(offsets) != len(values):
        raise _Malformed("logprobs and text_offset differ in length")
    if not all(v is None or isinstance(v, (int, float)) for v in values) or \
            not all(isinstance(o, int) for o in offsets):
        raise _Malformed("non-numeric logprobs or offsets")
    base = offsets[0] if offsets else 0
    return values, [o - base for o in offsets]


class EndpointSampler:
    """The `Sampler` protocol over HTTP. `stats` counts requests, retries by reason, failed rows."""

    def __init__(self, model: str, cfg):
        self.cfg = cfg
        self.settings = EndpointSettings.of(cfg)
        self.model = self.settings.endpoint_model or model
        self.stats: Counter = Counter()
        # what the endpoint was asked for, from this sampler's start: every request sent (retries and
        # refusals too) and the tokens its answers' `usage` reported (`usage_totals`); not row notes
        self.usage: Counter = Counter()
        self.loss_notes: list[list[str]] = []  # per row of the last reference_loss call
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._echo_max_tokens = 0  # 1 once a server refuses max_tokens=0 with echo
        self._logprobs = True  # False once the server refuses them
        # False once the server refuses to score given text (echo, or logprobs with it): the rest
        # of the rows are not asked again (a hosted API bills every refused request too); a chat
        # API scores no given text at all
        self._echo = not self.settings.chat
        self._budget_key = "max_tokens"  # a chat server may want max_completion_tokens instead (`_chat_post`)

    @property
    def draws_tokens(self) -> bool:
        """Whether one-token draws continue a text (the sampled next-token probes): a chat
        model's first token opens an answer, not the text's next token."""
        return not self.settings.chat

    def __repr__(self) -> str:
        return f"EndpointSampler(model={self.model!r}, url={self.settings.completions_url!r})"

    def check(self) -> None:
        """One tiny request (a token of a one-line prompt) with the sampler's retries: `BadInput`,
        saying what the endpoint answered, where it refuses it or never answers. An audit asks it
        before any stage, so a wrong URL, model name or key fails in seconds, not at the target's
        collection after the card is built."""
        from leakray.errors import BadInput

        where = f"the endpoint {self.settings.completions_url} (model {self.model!r})"
        try:
            if self.settings.chat:  # learns, as the collection would, which token budget the server takes
                self._chat_post({"model": self.model, "messages": chat.messages("def f():\n"), "temperature": 0.0}, 1,
                                lambda body: _chat_choices(body, 1), "check", False)
            else:
                self._post({"model": self.model, "prompt": "def f():\n", "max_tokens": 1, "temperature": 0.0},
                           lambda body: _choices(body, 1), "check")
        except _Refused as exc:
            hint = (f"; is the key in ${self.settings.api_key_env} right?" if exc.status in (401, 403)
                    else "; is the model name right (--target, sample.endpoint_model)?" if exc.status == 404 else "")
            raise BadInput(f"{where} refused a one-token request: http_{exc.status} {exc.message}".rstrip() + hint,
                           field="sample.endpoint_url") from None
        except _RowFailed as exc:
            raise BadInput(f"{where} did not answer a one-token request ({exc.reason}, after "
                           f"{self.settings.max_retries} retries)", field="sample.endpoint_url") from None

    # -- the protocol -----------------------------------------------------------------------

    def sample(self, prompts: list[str], languages: list[str], keys: list[str], *,
               k: int | None = None, greedy: bool = False) -> list[Samples]:
        n = n_completions(self.cfg, k, greedy)
        temperature = 0.0 if greedy else self.cfg.temperature
        top_p = 1.0 if greedy else self.cfg.top_p
        return self._map(lambda p, lang, key: self._sample_one(p, lang, key, n, temperature, top_p),
                         list(zip(prompts, languages, keys)))

    def greedy_probe(self, prompts: list[str], languages: list[str], keys: list[str],
                     max_new_tokens: int) -> list[str]:
        """One temperature-0 request per text, without log-probs (a probe reads text only); the
        requests of a task go out together on the pool, and a server with prefix caching (vLLM)
        reuses their common prefix. A text the endpoint never answered raises `ProbeFailed`
        (its row fails, with the reason): an empty continuation would read as a wrong guess."""
        tokens = min(max_new_tokens, self.cfg.max_new_tokens)
        got = self._map(lambda p, lang, key: self._sample_one(p, lang, key, 1, 0.0, 1.0, max_tokens=tokens,
                                                              logprobs=False),
                        list(zip(prompts, languages, keys)))
        for s, key in zip(got, keys):
            if failed_reason(s) is not None:
                raise ProbeFailed(key, failed_reason(s))
        return [s.completions[0] for s in got]

    def next_token_draws(self, texts: list[str], keys: list[str], n: int) -> list[list[str]]:
        """One request per text: ``n`` choices of one token at temperature 1, top-p 1, no stop
        strings and no log-probs, the text sent as given; more than ``sample.max_n`` choices go
        out as several requests (OpenAI's completions cap ``n`` at 128). A text the endpoint
        never answered raises `ProbeFailed`, as a greedy probe does."""
        return self._map(lambda text, key: self._draw_one(text, key, n), list(zip(texts, keys)))

    def _draw_one(self, text: str, key: str, n: int) -> list[str]:
        if not self.draws_tokens:  # the collection skips these probes (`draws_tokens`): a caller's bug
            raise ProbeFailed(key, "chat_api_draws_no_next_token")
        draws: list[str] = []
        for part, start in enumerate(range(0, n, self.cfg.max_n)):
            m = min(self.cfg.max_n, n - start)
            # the first request is seeded as a single one is (n <= max_n draws what it always drew);
            # each further one by a key of its own, so its draws are not the first one's again
            payload = {"model": self.model, "prompt": text, "n": m, "max_tokens": 1, "temperature": 1.0,
                       "top_p": 1.0, "seed": task_seed(self.cfg.seed, key if not part else f"{key}#draws{part}")}
            try:
                choices = self._post(payload, lambda body, m=m: _choices(body, m), key)
            except _Refused as exc:
                raise ProbeFailed(key, f"http_{exc.status}") from None
            except _RowFailed as exc:
                raise ProbeFailed(key, exc.reason) from None
            draws += [c["text"] for c in choices]
        return draws

    def reference_loss(self, prompts: list[str], references: list[str]) -> list[float]:
        """Mean NLL of the solution's tokens (those not wholly inside the generation prompt),
        from the target's log-probs of the echoed program; NaN with a note in `loss_notes`
        (one list per row) where the target does not score given text or the request failed."""
        return [s.loss for s in self.reference_scores(prompts, references)]

    def reference_scores(self, prompts: list[str], references: list[str]) -> list[RefScores]:
        """`reference_loss`'s scored tokens' log-probs; mu/sigma/rank None (an echo has no
        distribution), said in each row's notes. `loss_notes` keeps only why a loss is NaN."""
        out = self._map(self._loss_one, list(zip(prompts, references)))
        self.loss_notes = [notes for _, notes in out]
        return [RefScores.unscorable(notes) if got is None else scores_from_logprobs(got[0], context=got[1])
                for got, notes in out]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- one row ----------------------------------------------------------------------------

    def _sample_one(self, prompt: str, lang: str, key: str, k: int, temperature: float, top_p: float,
                    max_tokens: int | None = None, logprobs: bool = True) -> Samples:
        if self.settings.chat:
            return self._chat_one(prompt, lang, key, k, temperature, top_p, max_tokens, logprobs)
        base = generation_prompt(prompt)
        stops = server_stops(prompt, lang)[:_MAX_STOPS]
        payload = {"model": self.model, "prompt": base, "n": k, "max_tokens": max_tokens or self.cfg.max_new_tokens,
                   "temperature": temperature, "top_p": top_p,
                   "seed": task_seed(self.cfg.seed, key)}
        if stops:
            payload["stop"] = stops

        def parse(body):
            return [(c, _token_logprobs(c)) for c in _choices(body, k)]

        def post():
            asked = self._logprobs and logprobs
            try:
                return self._post({**payload, "logprobs": 1} if asked else payload, parse, key)
            except _Refused as exc:
                if not asked or "logprob" not in exc.message.lower():
                    raise
                self._logprobs = False  # a target that refuses logprobs: completions without them
                return self._post(payload, parse, key)

        def keep(choice: dict, lps) -> tuple[str, list[int], list[str]]:
            raw = choice["text"]
            # a stop string the server cut off ends the unit there (vLLM names it in stop_reason):
            # putting it back lets the cut also drop what goes with it (comments just before)
            stop = choice.get("stop_reason")
            tail = stop if isinstance(stop, str) and choice.get("finish_reason") == "stop" else ""
            # (the cut may fall inside the stop string, after its newline: the text keeps none
            # of it, the token count does, as the HF sampler's, whose raw text has the stop)
            cut = cut_point(prompt, raw + tail, lang)
            if lps is None:
                return raw[:cut], [], []
            n = max(1, sum(1 for o in lps[1] if o < cut))  # an immediate EOS has a probability too
            return raw[:cut], list(range(min(n, len(lps[0])))), []

        return self._read(key, post, logprobs, keep)

    def _read(self, key: str, post, logprobs: bool, keep) -> Samples:
        """The row's samples from ``post()``'s (choice, its log-probs or None) pairs, or the failed
        row; ``keep(choice, lps)`` gives the text kept, the indices of the tokens that generated
        it and what was undone to find it (notes)."""
        try:
            choices = post()
        except _Refused as exc:
            return self._failed(key, f"http_{exc.status}")
        except _RowFailed as exc:
            return self._failed(key, exc.reason)
        notes = [NO_LOGPROBS] if logprobs and any(lps is None for _, lps in choices) else []
        texts, ppls, counts = [], [], []
        for choice, lps in choices:
            text, picked, undone = keep(choice, lps)
            notes += [n for n in undone if n not in notes]
            texts.append(text.rstrip() + "\n")
            kept = [] if lps is None else [v for v in (lps[0][j] for j in picked) if v is not None]
            ppls.append(math.exp(-sum(kept) / len(kept)) if kept else math.nan)
            counts.append(0 if lps is None else len(picked))
        return self._samples(texts, ppls, counts, notes)

    def _chat_one(self, prompt: str, lang: str, key: str, k: int, temperature: float, top_p: float,
                  max_tokens: int | None, logprobs: bool) -> Samples:
        """`_sample_one` through the chat API: the continuation of the generation prompt read out of
        each answer (`chat.continuation_span`), cut as a completion is, its perplexity over the
        answer's tokens that overlap the kept text. No stop strings: an answer opens with a fence
        or prose, where a code stop string could end it; the cut is made here."""
        base = generation_prompt(prompt)
        budget = (max_tokens or self.cfg.max_new_tokens) + self.settings.chat_extra_tokens
        payload = {"model": self.model, "messages": chat.messages(base), "n": k,
                   "temperature": temperature, "top_p": top_p, "seed": task_seed(self.cfg.seed, key)}

        def parse(body):
            return [(c, chat.token_logprobs(c)) for c in _chat_choices(body, k)]

        def keep(choice: dict, lps) -> tuple[str, list[int], list[str]]:
            answer = choice["text"]
            start, end, undone = chat.continuation_span(base, answer)
            cut = cut_point(prompt, answer[start:end], lang)
            picked = [] if lps is None else chat.covering(lps[1], start, start + cut, len(answer))
            return answer[start:start + cut], picked, undone

        return self._read(key, lambda: self._chat_post(payload, budget, parse, key, self._logprobs and logprobs),
                          logprobs, keep)

    def _chat_post(self, payload: dict, budget: int, parse, key: str, logprobs: bool):
        """`_post` of a chat request, learning once what the server refuses: log-probabilities
        (then none are asked again), or `max_tokens` where it wants `max_completion_tokens` (newer
        OpenAI models); each refusal costs one more request, once per sampler."""
        while True:
            body = {**payload, self._budget_key: budget, **({"logprobs": True} if logprobs and self._logprobs else {})}
            try:
                return self._post(body, parse, key)
            except _Refused as exc:
                message = exc.message.lower()
                if "logprob" in message and "logprobs" in body:
                    self._logprobs = False
                elif "max_completion_tokens" in message and self._budget_key == "max_tokens":
                    self._budget_key = "max_completion_tokens"
                else:
                    raise

    def _loss_one(self, prompt: str, reference: str) -> tuple[tuple[list[float], list[float]] | None, list[str]]:
        """((the scored tokens' log-probs, the prompt tokens'), []) or (None, why not)."""
        cont = continuation(prompt, reference)
        if not cont.strip():
            return self._no_continuation()
        if not self._echo:
            return None, [REF_LOSS_UNSUPPORTED]
        text, start = program_of(prompt, cont), len(generation_prompt(prompt))
        payload = {"model": self.model, "prompt": text, "echo": True, "logprobs": 1, "temperature": 0.0}

        def parse(body):
            return _token_logprobs(_choices(body, 1)[0])

        try:
            asked = self._echo_max_tokens
            try:
                lps = self._post({**payload, "max_tokens": asked}, parse, "reference")
            except _Refused as exc:
                if asked or "max_tokens" not in exc.message:
                    raise
                self._echo_max_tokens = 1  # a server that must generate: only the echo is scored
                lps = self._post({**payload, "max_tokens": 1}, parse, "reference")
        except _Refused as exc:
            message = exc.message.lower()
            if "logprob" in message or "echo" in message:
                self._echo = False
                return None, [REF_LOSS_UNSUPPORTED]
            # refused for this text (longer than the context, as vLLM refuses it): the row keeps its
            # samples with no loss, as the HF sampler's rows keep theirs where it must cut the context
            return None, [f"{REF_LOSS_REFUSED}http_{exc.status}"]
        except _RowFailed as exc:  # retries spent: the row fails, and the collection may try it again
            return None, [f"ref_loss_{FAILED}{exc.reason}"]
        if lps is None:
            return None, [REF_LOSS_UNSUPPORTED]
        values, offsets = lps
        ends = offsets[1:] + [len(text)]
        # scored: tokens not wholly inside the prompt (one straddling the boundary is scored,
        # as sampling would have produced it: `reference_tokens`' rule for the HF sampler)
        scored = [v for v, o, e in zip(values, offsets, ends) if e > start and o < len(text) and v is not None]
        if not scored:
            return self._no_continuation()
        # the prompt's own tokens (the first has no log-prob: nothing predicts it)
        context = [float(v) for v, e in zip(values[1:], ends[1:]) if e <= start and v is not None]
        return ([float(v) for v in scored], context), []

    def _no_continuation(self) -> tuple[None, list[str]]:
        with self._lock:
            self.stats[REF_LOSS_NO_CONTINUATION] += 1
        return None, [REF_LOSS_NO_CONTINUATION]

    def _failed(self, key: str, reason: str) -> Samples:
        with self._lock:
            self.stats["failed_rows"] += 1
        log.warning("endpoint row %s failed: %s", key, reason)
        return self._samples([], [], [], [FAILED + reason])

    @staticmethod
    def _samples(texts, ppls, counts, notes) -> Samples:
        out = Samples(texts, ppls, counts)
        out.notes = notes  # read as getattr(sample, "notes", []) by the collection
        return out

    # -- HTTP -------------------------------------------------------------------------------

    def _map(self, fn, jobs: list[tuple]) -> list:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="endpoint")
        return list(self._pool.map(lambda job: fn(*job), jobs))

    def _session(self):
        import requests
        from requests.adapters import HTTPAdapter

        session = getattr(self._local, "session", None)
        if session is None:  # one per worker thread: requests.Session is not thread-safe
            session = self._local.session = requests.Session()
            session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0))
            session.mount("https://", HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0))
        return session

    def _count_usage(self, body) -> None:
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return
        with self._lock:
            for name in ("prompt_tokens", "completion_tokens"):
                if isinstance(usage.get(name), int):
                    self.usage[name] += usage[name]

    def _headers(self) -> dict:
        key = os.environ.get(self.settings.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _post(self, payload: dict, parse, key: str):
        """`parse(response JSON)` after retries; raises _RowFailed (retries spent) or _Refused."""
        import requests

        s = self.settings
        for attempt in range(s.max_retries + 1):
            wait = None
            with self._lock:
                self.stats["requests"] += 1
                self.usage["requests"] += 1
            try:
                resp = self._session().post(s.completions_url, json=payload, headers=self._headers(),
                                            timeout=(s.timeout_s, s.timeout_s))
            except requests.Timeout:
                reason = "timeout"
            except requests.RequestException:
                reason = "connection"
            else:
                status = resp.status_code
                if status == 200:
                    try:
                        body = resp.json()
                        self._count_usage(body)
                        return parse(body)
                    except (ValueError, KeyError, TypeError, AttributeError, IndexError):  # incl. _Malformed
                        reason = "malformed_json"
                elif status in _RETRY_STATUS or status >= 500:
                    reason, wait = f"http_{status}", _retry_after(resp.headers.get("Retry-After"))
                else:
                    raise _Refused(status, _server_message(resp))
            if attempt == s.max_retries:
                raise _RowFailed(reason)
            if wait is None:  # exponential backoff, half of it jittered
                step = s.backoff_s * 2**attempt
                wait = step / 2 + random.uniform(0, step / 2)
            wait = min(wait, _MAX_WAIT_S)
            with self._lock:
                self.stats["retries"] += 1
                self.stats[f"retry_{reason}"] += 1
            log.info("endpoint request for %s: %s, retry %d/%d in %.2fs", key, reason, attempt + 1,
                     s.max_retries, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")


def usage_totals(sampler) -> dict | None:
    """What an endpoint sampler has asked for so far (`EndpointSampler.usage`): requests sent,
    retries among them, and the prompt and generated tokens the answers' `usage` reported (0
    where the server reports none); None for a sampler that sends no requests."""
    usage = getattr(sampler, "usage", None)
    if usage is None:
        return None
    return {"requests": usage["requests"], "retries": sampler.stats["retries"],
            "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"]}


def _server_message(resp) -> str:
    try:
        err = resp.json().get("error")
        return str(err.get("message", "") if isinstance(err, dict) else err or "")[:200]
    except (ValueError, AttributeError):
        return resp.text[:200]
