"""What a collection will ask of a target behind an endpoint, counted before it runs.

`SampleStage` with the endpoint backend (`sample.backend=openai`) works task by task, and each of
its passes sends one request per text: the task's k samples (`n=k`), the reference scored by `echo`,
the upper-cased prompt's k samples, one greedy completion per AdvPrompt variant, one per probe
cut or masked span, the greedy probe's one, and at each sampled probe cut `next_draws` one-token
choices in requests of at most `sample.max_n`. `collection_requests` counts those from the tasks
and the settings alone: no model is loaded and nothing is sent. A hosted API bills the characters
sent (as tokens of its own tokenizer, which this does not know) and the tokens generated, and
rate-limits the requests.

Through the chat API (`sample.endpoint_api=chat`, `leakray.models.chat`) each text goes inside the
request's messages (their characters are counted), each answer may take `sample.chat_extra_tokens`
more, and nothing is scored by `echo` or drawn one token at a time: those passes send nothing.

The counts assume every request is answered the first time: a retry (`sample.max_retries`), a
row tried again (`sample.row_retries`) or the one extra request after a refused option (`logprobs`,
`max_tokens=0` with `echo`) adds to them, and an endpoint that refuses `echo` is asked for it once
per sampler, not once per task. AdvPrompt's variants come from the perturb stage, which keeps
only the variants it proved: without them (``adv_prompts`` None) each task is counted with every
slot of the completed kinds, an upper bound, and each variant as long as the task's prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from leakray.data.tasks import continuation, generation_prompt, program_of
from leakray.schema import T


@dataclass
class Part:
    """One pass of the collection: ``requests`` sent, ``choices`` asked for in them (their `n`
    summed), ``max_tokens`` the answers may generate (each choice's `max_tokens` summed: at most),
    ``characters`` of prompt text sent."""

    name: str
    requests: int = 0
    choices: int = 0
    max_tokens: int = 0
    characters: int = 0

    def add(self, text: str, n: int, max_tokens: int, requests: int = 1) -> None:
        self.requests += requests
        self.choices += n
        self.max_tokens += n * max_tokens
        self.characters += len(text) * requests


@dataclass
class RequestPlan:
    parts: list[Part] = field(default_factory=list)
    tasks: int = 0
    bound: list[str] = field(default_factory=list)  # the parts counted as an upper bound, and why
    notes: list[str] = field(default_factory=list)  # what the plan leaves out, and why

    @property
    def total(self) -> Part:
        t = Part("total")
        for p in self.parts:
            t.requests, t.choices = t.requests + p.requests, t.choices + p.choices
            t.max_tokens, t.characters = t.max_tokens + p.max_tokens, t.characters + p.characters
        return t


def collection_requests(tasks: list[dict], sample, extra, adv_prompts: list[list[str] | None] | None = None,
                        advprompt_kinds: tuple[str, ...] | None = None) -> RequestPlan:
    """The requests `SampleStage(model, sample, extra)` sends an endpoint for ``tasks`` (dicts with
    the task schema's prompt, reference and language), per pass. ``adv_prompts``: each task's
    AdvPrompt prompts as the collection's input has them (`stages.prove.attach_variants`); None
    with ``extra.advprompt``: every slot of ``advprompt_kinds`` (None: all kinds), an upper bound."""
    from leakray.features import probes as pr
    from leakray.perturb.case import uppercase_prompt

    k, budget = sample.k, sample.max_new_tokens
    probe_budget = min(extra.probe_tokens, budget)  # as EndpointSampler.greedy_probe caps it
    chatted = sample.endpoint_api == "chat"
    extra_tokens = sample.chat_extra_tokens if chatted else 0
    parts: dict[str, Part] = {}

    def ask(name: str, text: str, n: int, max_tokens: int, requests: int = 1) -> None:
        """One pass's request(s) for ``text``, as the sampler sends them."""
        if chatted:  # the text inside the messages, the answer's budget with room for its wrapper
            text, max_tokens = chat_text(text), max_tokens + extra_tokens
        parts.setdefault(name, Part(name)).add(text, n, max_tokens, requests)

    plan = RequestPlan(tasks=len(tasks))
    if chatted:
        skipped = [n for n in extra.probes if n in pr.DRAW_PROBES]
        draws = f" and the {' and '.join(skipped)} probes' one-token draws are not asked for" if skipped else ""
        plan.notes.append(f"through the chat API nothing is scored by `echo`{draws}: the detectors reading them "
                          "do not run on this target")
    if extra.advprompt and adv_prompts is None:
        from leakray.perturb.core import SLOTS

        slots = 1 + sum(1 for kind, _ in SLOTS if advprompt_kinds is None or kind in advprompt_kinds)
        plan.bound.append(f"AdvPrompt variants: all {slots - 1} slots of the completed kinds per task, each as long "
                          "as the task's prompt (the perturb stage keeps only the variants it proves)")
    for i, t in enumerate(tasks):
        prompt, ref, lang = t[T.PROMPT], t[T.REFERENCE], t[T.LANGUAGE]
        ask("samples", generation_prompt(prompt), k, budget)
        cont = continuation(prompt, ref)
        if cont.strip() and not chatted:  # an empty continuation is not asked for (`EndpointSampler._loss_one`)
            ask("reference scores (echo)", program_of(prompt, cont), 1, 0)
        if extra.upper_case:
            ask("upper-cased prompt", generation_prompt(uppercase_prompt(prompt, lang)), k, budget)
        if extra.advprompt:
            if adv_prompts is None:
                for _ in range(slots):
                    ask("AdvPrompt variants", generation_prompt(prompt), 1, budget)
            else:
                for variant in adv_prompts[i] or []:
                    if variant:  # an empty slot (a variant not proved, another kind's) is not asked for
                        ask("AdvPrompt variants", generation_prompt(variant), 1, budget)
        for name in extra.probes:
            if name in ("prefix", "mask"):
                at = pr.prefix_cuts(prompt, ref) if name == "prefix" else [a for a, _ in pr.mask_spans(prompt, ref)]
                for cut in at:
                    ask(f"probe: {name}", generation_prompt(pr.given_and_target(prompt, ref, cut)[0]), 1, probe_budget)
            elif name in pr.DRAW_PROBES:
                if chatted:  # a chat model draws no next token (`EndpointSampler.draws_tokens`)
                    continue
                cut_at, given_at = pr.DRAW_PROBES[name]
                per_cut = math.ceil(extra.next_draws / sample.max_n)
                for cut in cut_at(prompt, ref, extra.next_cuts):
                    # the text goes as given (no generation prompt): a draw continues it exactly
                    ask(f"probe: {name}", given_at(prompt, ref, cut)[0], extra.next_draws, 1, per_cut)
            else:  # greedy: the prompt alone, the sampler's budget
                ask(f"probe: {name}", generation_prompt(prompt), 1, budget)
    plan.parts = list(parts.values())
    return plan


def chat_text(given: str) -> str:
    """What a chat request sends for ``given``: its messages' text (`leakray.models.chat.messages`)."""
    from leakray.models.chat import messages

    return "".join(m["content"] for m in messages(given))
