"""A small local OpenAI-compatible `/v1/completions` server backed by a Hugging Face causal LM,
with `/v1/chat/completions` playing a chat model that continues the code it is asked to.

For tests and benchmarks of the endpoint sampler: it speaks the protocol the way vLLM's
server does (`n`, `seed`, `stop`, `logprobs` with `tokens`/`token_logprobs`/`text_offset`,
`echo` with `max_tokens=0`, `stop_reason` naming the stop string that ended a choice), with
raw (unwarped) log-probabilities, so what the client computes can be checked against the
model itself. Faults (429 with Retry-After, 5xx, slow replies, malformed JSON, ...) are
injected per request by a callable. Loopback only; it stops by itself after `lifetime_s`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A fault hook sees each request's JSON body and the running request count and answers
# None (serve normally) or one of: "429:<retry-after s>", any status ("500", "400:<message>"),
# "sleep:<s>" (reply after s seconds), "garbage" (200, not JSON), "no_choices" (200, JSON
# without choices), "drop" (close the connection without a reply).
FaultHook = Callable[[dict, int], "str | None"]


class BadRequest(Exception):
    """The request is refused with 400 (what a server says about unsupported parameters)."""


class HFBackend:
    """Completions from a local HF model: seeded sampling per request, raw log-probs."""

    def __init__(self, model_path: str, threads: int = 1, no_logprobs: str | None = None,
                 forced: dict[str, list[str]] | None = None, chat_style: str = "plain",
                 chat_budget_key: str = "max_tokens"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.tok = AutoTokenizer.from_pretrained(model_path)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        from leakray.models.host import load_dtype

        # a 16-bit checkpoint as float32: this server runs on the CPU (load_dtype says why)
        dtype = load_dtype("auto", model_path, "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()
        self.max_len = getattr(self.model.config, "max_position_embeddings", None) or self.model.config.n_positions
        # a target without logprobs: "ignore" answers without them, "refuse" answers 400
        self.no_logprobs = no_logprobs
        # prompt -> completion texts served instead of samples (choice i gets text i mod len),
        # with the model's log-probs of their tokens: cuts and stops exactly where a test wants
        self.forced = dict(forced or {})
        if chat_style not in CHAT_STYLES:
            raise ValueError(f"chat_style is one of {sorted(CHAT_STYLES)}")
        self.chat_style = chat_style
        # the chat route's token budget parameter: newer OpenAI models refuse max_tokens for max_completion_tokens
        self.chat_budget_key = chat_budget_key
        self.lock = threading.Lock()  # one generate at a time: the model is the bottleneck anyway

    def complete(self, body: dict) -> dict:
        import torch

        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string")
        n, max_tokens = int(body.get("n", 1)), int(body.get("max_tokens", 16))
        want_lp = body.get("logprobs") is not None
        echo = bool(body.get("echo", False))
        if want_lp and self.no_logprobs:
            if echo or self.no_logprobs == "refuse":
                raise BadRequest("logprobs are not supported for this model")
            want_lp = False
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        ids = self.tok(prompt, return_tensors="pt")["input_ids"]
        if ids.shape[1] + max_tokens > self.max_len:  # as vLLM: refused, not truncated
            raise BadRequest(f"prompt ({ids.shape[1]} tokens) + max_tokens ({max_tokens}) exceed {self.max_len}")
        with self.lock, torch.inference_mode():
            echoed = self._echo(ids, prompt) if echo else None
            if max_tokens == 0:
                choices = [self._choice(i, "", [], [], [], "length", None) for i in range(n)]
            else:
                choices = self._generate(ids, n, max_tokens, body, stops)
        generated = sum(len(c["logprobs"]["tokens"]) for c in choices)  # before the echo joins the prompt's
        for c in choices:
            if echoed is not None:
                toks, lps, offs = echoed
                c["text"] = prompt + c["text"]
                lp = c["logprobs"]
                lp["tokens"] = toks + lp["tokens"]
                lp["token_logprobs"] = lps + lp["token_logprobs"]
                lp["text_offset"] = offs + [o + len(prompt) for o in lp["text_offset"]]
                lp["top_logprobs"] = [None] + [{t: v} for t, v in zip(toks[1:], lps[1:])] + lp["top_logprobs"]
            if not want_lp:
                c["logprobs"] = None
        return {"object": "text_completion", "model": body.get("model", ""), "choices": choices,
                "usage": {"prompt_tokens": ids.shape[1], "completion_tokens": generated,
                          "total_tokens": ids.shape[1] + generated}}

    def chat(self, body: dict) -> dict:
        """A chat model that does what `leakray.models.chat.messages` asks: it continues the given
        text (sampled as `complete` samples it, the same seed giving the same tokens) and answers
        in its `chat_style`: the bare continuation, fenced, or a sentence and a fence around the
        given code written out again before the continuation. Each wrapper piece is one token of
        log-prob 0 in `logprobs.content` and takes one token of `max_tokens`; a closing fence only
        ends an answer that was not cut short."""
        from leakray.models.chat import given_of

        try:
            given = given_of(body.get("messages") or [])
        except (ValueError, AttributeError):
            raise BadRequest("messages must hold a user message with text content") from None
        other = ({"max_tokens", "max_completion_tokens"} - {self.chat_budget_key}).pop()
        if other in body:
            raise BadRequest(f"Unsupported parameter: '{other}' is not supported with this model. "
                             f"Use '{self.chat_budget_key}' instead.")
        head, repeat, tail = CHAT_STYLES[self.chat_style]
        repeat = given if repeat else ""
        pieces = [p for p in (head, repeat) if p]
        max_tokens = int(body.get(self.chat_budget_key, 16))
        budget = max_tokens - len(pieces)
        if budget < 1:  # cut short inside its wrapper
            pieces = pieces[:max_tokens]
            choices = [{"index": i, "message": {"role": "assistant", "content": "".join(pieces)},
                        "finish_reason": "length",
                        "logprobs": {"content": [{"token": p, "logprob": 0.0} for p in pieces]}
                        if body.get("logprobs") else None} for i in range(int(body.get("n", 1)))]
            return {"object": "chat.completion", "model": body.get("model", ""), "choices": choices,
                    "usage": {"prompt_tokens": 0, "completion_tokens": len(pieces) * len(choices)}}
        inner = {k: body[k] for k in ("n", "temperature", "top_p", "seed") if k in body}
        got = self.complete({**inner, "prompt": given, "max_tokens": budget,
                             **({"logprobs": 1} if body.get("logprobs") else {})})
        choices = []
        for c in got["choices"]:
            end = [tail] if tail and c["finish_reason"] == "stop" else []
            content = "".join(pieces) + c["text"] + "".join(end)
            lp = c["logprobs"]
            logprobs = None if lp is None else {"content": (
                [{"token": p, "logprob": 0.0} for p in pieces]
                # the continuation's own tokens; an EOS spells nothing and is listed only where it is
                # the whole answer (its probability is then the answer's)
                + [{"token": t if o < len(c["text"]) else "", "logprob": v}
                   for j, (t, v, o) in enumerate(zip(lp["tokens"], lp["token_logprobs"], lp["text_offset"]))
                   if o < len(c["text"]) or j == 0]
                + [{"token": p, "logprob": 0.0} for p in end])}
            choices.append({"index": c["index"], "message": {"role": "assistant", "content": content},
                            "finish_reason": c["finish_reason"], "logprobs": logprobs})
        return {"object": "chat.completion", "model": body.get("model", ""), "choices": choices,
                "usage": got["usage"]}

    def _offsets(self, ids: list[int]) -> tuple[list[str], list[int], str]:
        """Token strings and start offsets as decoded text (vLLM's detokenised form)."""
        offs, prev = [], 0
        for j in range(len(ids)):
            offs.append(prev)
            prev = len(self.tok.decode(ids[: j + 1], skip_special_tokens=True))
        text = self.tok.decode(ids, skip_special_tokens=True)
        ends = offs[1:] + [len(text)]
        toks = [text[a:b] or self.tok.convert_ids_to_tokens(t) for a, b, t in zip(offs, ends, ids)]
        return toks, offs, text

    def _echo(self, ids, prompt: str):
        import torch

        logits = self.model(input_ids=ids).logits.float()
        lps = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
        toks, offs, _ = self._offsets(ids[0].tolist())
        return toks, [None] + lps, offs

    def _generate(self, ids, n: int, max_tokens: int, body: dict, stops: list[str]) -> list[dict]:
        import torch

        if body["prompt"] in self.forced:
            return self._forced(ids, n, max_tokens, body["prompt"], stops)
        temperature = float(body.get("temperature", 1.0))
        if body.get("seed") is not None:
            torch.manual_seed(int(body["seed"]))
        if max_tokens == 1 and n > 1:
            return self._one_token(ids, n, temperature, float(body.get("top_p", 1.0)), stops)
        sampling = dict(do_sample=True, temperature=temperature, top_p=float(body.get("top_p", 1.0)), top_k=0) \
            if temperature > 0 else dict(do_sample=False)
        gen = self.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
            num_return_sequences=n, output_logits=True, return_dict_in_generate=True,
            pad_token_id=self.tok.pad_token_id, stop_strings=stops or None, tokenizer=self.tok, **sampling)
        new = gen.sequences[:, ids.shape[1]:]
        logprobs = torch.log_softmax(torch.stack(gen.logits, dim=1).float(), dim=-1)  # raw: unwarped
        logprobs = logprobs.gather(-1, new[..., None]).squeeze(-1)
        return [self._finish(s, new[s].tolist(), logprobs[s].tolist(), stops) for s in range(n)]

    def _one_token(self, ids, n: int, temperature: float, top_p: float, stops: list[str]) -> list[dict]:
        """n one-token samples (the sampled next-token probes ask for 128 at each of up to 64 cuts)
        from one forward pass: `generate` would prefill the prompt once per returned sequence,
        which made a 164-task endpoint collection take over half an hour on this served model.
        The same distribution, warped by transformers' own temperature and top-p processors."""
        import torch
        from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

        logits = self.model(input_ids=ids).logits[:, -1].float()
        raw = torch.log_softmax(logits, dim=-1)[0]  # what the logprobs report: unwarped
        if temperature > 0:
            warped = TemperatureLogitsWarper(temperature)(ids, logits)
            if top_p < 1.0:
                warped = TopPLogitsWarper(top_p)(ids, warped)
            drawn = torch.multinomial(torch.softmax(warped, dim=-1)[0], n, replacement=True).tolist()
        else:
            drawn = [int(logits[0].argmax())] * n
        return [self._finish(s, [t], [float(raw[t])], stops) for s, t in enumerate(drawn)]

    def _forced(self, ids, n: int, max_tokens: int, prompt: str, stops: list[str]) -> list[dict]:
        """Fixed completion texts, scored by the model as if it had sampled them."""
        import torch

        texts = self.forced[prompt]
        choices = []
        for s in range(n):
            seq = self.tok(texts[s % len(texts)])["input_ids"][:max_tokens]
            full = torch.cat([ids, torch.tensor([seq])], dim=1)
            logits = self.model(input_ids=full).logits[0, ids.shape[1] - 1: -1].float()
            lps = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(seq)[:, None]).squeeze(-1)
            choices.append(self._finish(s, seq, lps.tolist(), stops))
        return choices

    def _finish(self, index: int, seq: list[int], logprobs: list[float], stops: list[str]) -> dict:
        """One choice as vLLM reports it: EOS ends it (and is reported), a stop string is cut from
        the text and named in stop_reason, its tokens staying in the logprobs."""
        special, eos = set(self.tok.all_special_ids), self.tok.eos_token_id
        end = next((j for j, t in enumerate(seq) if t in special), len(seq))
        hit_eos = end < len(seq) and seq[end] == eos
        keep = seq[: end + 1] if hit_eos else seq[:end]
        toks, offs, text = self._offsets(keep)
        finish, stop_reason, n_keep = ("stop" if hit_eos else "length"), None, len(keep)
        found = [(text.find(st), st) for st in stops if st in text]
        if found:
            pos, stop_reason = min(found)
            n_keep = next(j + 1 for j in range(len(keep))
                          if j + 1 == len(keep) or offs[j + 1] >= pos + len(stop_reason))
            text, finish = text[:pos], "stop"
        return self._choice(index, text, toks[:n_keep], logprobs[:n_keep], offs[:n_keep], finish, stop_reason)

    @staticmethod
    def _choice(index, text, toks, lps, offs, finish, stop_reason) -> dict:
        return {"index": index, "text": text, "finish_reason": finish, "stop_reason": stop_reason,
                "logprobs": {"tokens": toks, "token_logprobs": lps, "text_offset": offs,
                             "top_logprobs": [{t: v} for t, v in zip(toks, lps)]}}


# chat_style -> (what opens the answer, whether it writes the given text out again, what closes it)
CHAT_STYLES = {"plain": ("", False, ""), "fenced": ("```python\n", False, "\n```"),
               "prose_repeat": ("Here is the code:\n\n```python\n", True, "\n```")}


class ReplayBackend:
    """Replays recorded responses (by prompt): a server whose cost is only its latency."""

    def __init__(self, responses: dict[str, dict]):
        self.responses = responses

    def complete(self, body: dict) -> dict:
        try:
            return self.responses[body["prompt"]]
        except KeyError:
            raise BadRequest("no recorded response for this prompt") from None


class CompletionServer:
    """`with CompletionServer(backend) as srv:` serves `srv.url` (".../v1") on 127.0.0.1."""

    def __init__(self, backend, fault: FaultHook | None = None, latency_s: float = 0.0,
                 lifetime_s: float = 600.0, api_key: str | None = None):
        self.backend, self.fault, self.latency_s = backend, fault, latency_s
        self.lifetime_s, self.api_key = lifetime_s, api_key
        self.requests: list[dict] = []  # bodies as received, in order
        self.auth_ok = 0  # requests whose Authorization matched api_key
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> CompletionServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._timer = threading.Timer(self.lifetime_s, self._httpd.shutdown)  # never outlives a test run
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()

    def count(self, predicate: Callable[[dict], bool]) -> int:
        with self._lock:
            return sum(1 for body in self.requests if predicate(body))


def _handler(server: CompletionServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

        def log_message(self, *args) -> None:  # quiet: tests read their own records
            pass

        def _send(self, status: int, payload: bytes, headers: dict | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                self.close_connection = True

        def _error(self, status: int, message: str, headers: dict | None = None) -> None:
            self._send(status, json.dumps({"error": {"message": message, "code": status}}).encode(), headers)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            route = self.path.rstrip("/")
            chat = route == "/v1/chat/completions" and hasattr(server.backend, "chat")
            if route != "/v1/completions" and not chat:
                return self._error(404, f"no route {self.path}")
            try:
                body = json.loads(raw)
            except ValueError:
                return self._error(400, "body is not JSON")
            with server._lock:
                server.requests.append(body)
                count = len(server.requests)
                expected = f"Bearer {server.api_key}" if server.api_key else None
                server.auth_ok += int(expected is not None and self.headers.get("Authorization") == expected)
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                self._serve(body, server.fault(body, count) if server.fault else None, chat)
            finally:
                with server._lock:
                    server.in_flight -= 1

        def _serve(self, body: dict, fault: str | None, chat: bool = False) -> None:
            if server.latency_s:
                time.sleep(server.latency_s)
            kind, _, arg = (fault or "").partition(":")
            if kind == "429":
                return self._error(429, "rate limited", {"Retry-After": arg} if arg else None)
            if kind.isdigit():
                return self._error(int(kind), arg or "injected error")
            if kind == "sleep":
                time.sleep(float(arg))
            elif kind == "garbage":
                return self._send(200, b'{"choices": [{"text": "def f(:')
            elif kind == "no_choices":
                return self._send(200, json.dumps({"object": "text_completion"}).encode())
            elif kind == "drop":
                self.close_connection = True
                return
            try:
                result = server.backend.chat(body) if chat else server.backend.complete(body)
            except BadRequest as exc:
                return self._error(400, str(exc))
            except Exception as exc:  # noqa: BLE001 - a server answers 500, it does not hang up
                return self._error(500, f"{type(exc).__name__}: {exc}")
            self._send(200, json.dumps(result).encode())

    return Handler
