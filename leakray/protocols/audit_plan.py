"""`leakray audit --plan`: what an audit will ask of the model under audit, before it asks.

On a hosted API an audit is paid by the request and the token, and rate-limited by both; most of
its requests are the text-only probes' (docs/AUDIT.md, "What an audit asks of an endpoint"). The
plan counts every request the audit's stages send the target
(`stages.request_plan`: its collection; the rewrite test's and the control route's `echo` scores;
the one-token check before any stage), from the tasks and the config alone: no model is loaded, no
request sent, no stage run. The shadow, the reference models and the detectors run here and cost
no request."""

from __future__ import annotations

from leakray.config import AuditConfig, to_stage
from leakray.data.tasks import continuation, program_of
from leakray.errors import BadInput
from leakray.features.probes import DRAW_PROBES
from leakray.schema import T
from leakray.stages.request_plan import Part, RequestPlan, chat_text, collection_requests

CHECK_PROMPT = "def f():\n"  # EndpointSampler.check's one-token request


def _echo(part: Part, prompt: str, reference: str) -> None:
    """One `echo` request scoring ``reference`` after ``prompt`` (`EndpointSampler._loss_one`)."""
    cont = continuation(prompt, reference)
    if cont.strip():
        part.add(program_of(prompt, cont), 1, 0)


def rewrite_requests(tasks: list[dict], n_rewrites: int, seed: int) -> Part:
    """The rewrite test's requests (`protocols.rewrite_scores`): each Python task's solution and its
    rewrites, each scored by `echo` under the target."""
    from leakray.perturb.rewrite import solution_rewrites

    part = Part("rewrite test (echo)")
    for t in tasks:
        if t[T.LANGUAGE] != "python":
            continue
        got = solution_rewrites(t[T.PROMPT], t[T.REFERENCE], t[T.TESTS], n_rewrites, seed, t[T.TASK_ID])
        if not isinstance(got, str):  # a reason none can be made: nothing is scored
            for program in [t[T.REFERENCE], *got]:
                _echo(part, t[T.PROMPT], program)
    return part


def control_requests(tasks: list[dict], control: list[dict]) -> Part:
    """The control route's requests (`protocols.control_scores`): every benchmark and control task
    scored by `echo` under the target."""
    part = Part("control route (echo)")
    for t in tasks + control:
        _echo(part, t[T.PROMPT], t[T.REFERENCE])
    return part


def audit_requests(cfg: AuditConfig, tasks: list[dict]) -> RequestPlan:
    """Per part, the requests the audit of ``tasks`` sends its target (the module docstring)."""
    from leakray.protocols.simulate import collect_config

    a = cfg.audit
    extra = collect_config(cfg).extra
    plan = collection_requests(tasks, to_stage(cfg.sample), extra, None, tuple(cfg.columns.advprompt_kinds))
    chatted = cfg.sample.endpoint_api == "chat"  # only with the openai backend (config.py refuses it otherwise)
    if cfg.sample.backend == "openai":  # the one-token check an audit of an endpoint asks first
        check = chat_text(CHECK_PROMPT) if chatted else CHECK_PROMPT
        plan.parts.insert(0, Part("endpoint check", 1, 1, 1, len(check)))
    if chatted and (a.rewrites or a.control):
        # both read the target's `echo` scores, which a chat API does not give: they send nothing
        plan.notes.append("the rewrite test and the control route score given text by `echo`, which a chat API "
                          "does not offer: they send nothing and report that they could not run")
        return plan
    if a.rewrites:
        plan.parts.append(rewrite_requests(tasks, a.rewrites, a.rewrite_seed))
    if a.control:
        from leakray.protocols.control_scores import load_control

        plan.parts.append(control_requests(tasks, load_control(a.control, tasks)[0]))
    return plan


def plan_lines(cfg: AuditConfig, plan: RequestPlan) -> list[str]:
    """The plan as a table a user reads before starting a paid audit."""
    served = cfg.sample.backend == "openai"
    chatted = cfg.sample.endpoint_api == "chat"
    where = (f"the endpoint {cfg.sample.endpoint_url} (model {cfg.sample.endpoint_model or cfg.audit.target}"
             f"{', through its chat API' if chatted else ''})"
             if served else f"the target, served here ({cfg.sample.backend}): nothing is sent to an endpoint; "
                            "the counts are what one serving it would be asked")
    rows = [("part", "requests", "choices", "tokens generated, at most", "prompt characters sent")]
    for p in [*plan.parts, plan.total]:
        rows.append((p.name, f"{p.requests:,}", f"{p.choices:,}", f"{p.max_tokens:,}", f"{p.characters:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def fmt(r: tuple) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    total = plan.total
    lines = [f"What this audit of {plan.tasks} tasks will ask of {where}:", "", fmt(rows[0]),
             *(fmt(r) for r in rows[1:-1]), fmt(rows[-1]), "",
             f"Per task: {total.requests / max(plan.tasks, 1):,.1f} requests, "
             f"{total.characters / max(plan.tasks, 1):,.0f} prompt characters.",
             "Counted with every request answered the first time: retries (sample.max_retries), rows tried again "
             "(sample.row_retries) and the one extra request after a refused option (logprobs, max_tokens=0) add to "
             "it. " + ("" if chatted else "An endpoint that refuses echo is asked for it once per sampler worker "
                       "(ray.sample_actors) and once by each of the rewrite test and the control route, in place of "
                       "the echo rows above. ")
             + "Prompt characters are not tokens: the endpoint's tokenizer decides how many tokens they are."]
    lines += [f"Upper bound: {why}." for why in plan.bound]
    lines += [f"Not asked: {why}." for why in plan.notes]
    largest = max(plan.parts, key=lambda p: p.choices, default=None)
    probe = largest.name.removeprefix("probe: ") if largest else None
    if probe in DRAW_PROBES:
        lines.append(f"Most of it is the {probe} probe's draws ({largest.choices:,} one-token choices in "
                     f"{largest.requests:,} requests): fewer draws per "
                     "cut (columns.next_draws), fewer cuts per task (columns.next_cuts), or leaving the probe or the "
                     "detectors that read it out (columns.probes, detect.detectors) makes it smaller.")
    return lines


def check_budget(cfg: AuditConfig, tasks: list[dict], console) -> RequestPlan:
    """Before an audit of an endpoint sends anything: say what it will ask, and refuse it when that
    is more than `audit.max_requests` (the plan's count: retries come on top)."""
    plan = audit_requests(cfg, tasks)
    total, cap = plan.total, cfg.audit.max_requests
    console.say(f"this audit will ask the endpoint {total.requests:,} requests ({total.choices:,} choices, "
                f"{total.characters:,} prompt characters; `leakray audit ... --plan` gives the parts)")
    if cap is not None and total.requests > cap:
        largest = max(plan.parts, key=lambda p: p.requests)
        raise BadInput(f"the audit would send the endpoint {total.requests:,} requests, more than "
                       f"audit.max_requests={cap:,} (the largest part: {largest.name}, {largest.requests:,}); "
                       "raise the cap or ask for less (leakray audit ... --plan)", field="audit.max_requests")
    return plan
