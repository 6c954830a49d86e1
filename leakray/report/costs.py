"""What a run cost, in words both report formats (markdown and HTML) share: an audit's time by
stage, with how busy the machine's CPUs were over each (from the stage markers,
`runs.Stage.finish`), the parts inside each stage and their throughput (`leakray.parts`), and a
detector's part of a run it shared with others."""

from __future__ import annotations


def time_by_stage(stages: dict, timings: dict) -> list[str]:
    """What the audit cost in time, slowest stage first, each with how busy the machine's CPUs were
    over it (`runs.machine_use`; a stage resumed from an earlier invocation keeps its own time):
    an audit of a paid endpoint or a large model is planned by it."""
    # a marker holds machine_cpu; a simulate report's stage table its busy share alone
    timed = sorted(((st.get("seconds"), name, (st.get("machine_cpu") or {}).get("busy_share", st.get("machine_busy")))
                    for name, st in stages.items() if (st.get("seconds") or 0) >= 0.05), key=lambda t: -t[0])
    if not timed:
        return []
    total = timings.get("total_this_invocation")
    donors = sorted({st["reused_from"] for st in stages.values() if st.get("reused_from")})
    return ["", "Time by stage (wall, in the invocation that ran it; the machine's CPUs busy over it): "
            + ", ".join(f"{name} {sec:.1f} s" + (f" ({busy:.0%})" if busy is not None else "")
                        + (" (adopted)" if stages[name].get("reused_from") else "")
                        for sec, name, busy in timed)
            + (f"; this invocation {total:.0f} s." if isinstance(total, (int, float)) else ".")
            # a stage adopted from a run made from the same inputs (runs.adopt) keeps that run's time
            + (f" Adopted stages were made by {', '.join(donors)} from the same inputs." if donors else "")]


def parts_text(stage: dict) -> str:
    """A stage's parts, slowest first, in seconds (summed over the processes that did them, so parts
    that ran side by side add up to more than the stage's wall time), e.g. "advprompt 151.0 s,
    sample 61.6 s"; "" for a stage that timed no parts."""
    parts = sorted(((s, p) for p, s in (stage.get("part_seconds") or {}).items() if s), reverse=True)
    return ", ".join(f"{p} {s:.1f} s" for s, p in parts)


def throughput_text(stage: dict) -> str:
    """A stage's throughputs, e.g. "488.3 generated tokens/s, 66.7 programs/s" (from the marker's
    ``<what>_per_s`` keys; one a stage could not measure is left out)."""
    return ", ".join(f"{v:g} {k.removesuffix('_per_s').replace('_', ' ')}/s"
                     for k, v in (stage.get("throughput") or {}).items() if v is not None)


def parts_by_stage(stages: dict) -> list[str]:
    """Where each stage's time went, inside it (`parts_text`, `throughput_text`): one line for the
    stages that timed their parts, slowest stage first."""
    timed = sorted(((st.get("seconds") or 0.0, name) for name, st in stages.items() if parts_text(st)), reverse=True)
    if not timed:
        return []
    return ["", "Inside the stages (each part's busy seconds, summed over the processes that did it; throughput): "
            + "; ".join(f"{name}: {parts_text(stages[name])}"
                        + (f" ({throughput_text(stages[name])})" if throughput_text(stages[name]) else "")
                        for _, name in timed) + "."]


def shared_run_note(cost: dict, num) -> str:
    """"shared by n, own trials x" for a detector fitted in one run with others (the classic models'
    Tune search, CGMIA with its ensemble), whose wall time is the whole run's and mostly waiting for
    a CPU; "" for a detector that ran alone. ``num`` formats the trials' seconds."""
    shared = cost.get("shared_run") or ()
    if len(shared) < 2:
        return ""
    own = cost.get("trial_s")
    return f"shared by {len(shared)}" + (f", own trials {num(own)}" if own is not None else "")
