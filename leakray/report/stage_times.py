"""One line for an audit's reports (markdown and HTML): what each stage cost in wall time and how
busy the machine's CPUs were over it, from the stage markers (`runs.Stage.finish`)."""

from __future__ import annotations


def time_by_stage(stages: dict, timings: dict) -> list[str]:
    """What the audit cost in time, slowest stage first, each with how busy the machine's CPUs were
    over it (`runs.machine_use`; a stage resumed from an earlier invocation keeps its own time):
    an audit of a paid endpoint or a large model is planned by it."""
    timed = sorted(((st.get("seconds"), name, (st.get("machine_cpu") or {}).get("busy_share"))
                    for name, st in stages.items() if (st.get("seconds") or 0) >= 0.05), key=lambda t: -t[0])
    if not timed:
        return []
    total = timings.get("total_this_invocation")
    return ["", "Time by stage (wall, in the invocation that ran it; the machine's CPUs busy over it): "
            + ", ".join(f"{name} {sec:.1f} s" + (f" ({busy:.0%})" if busy is not None else "")
                        for sec, name, busy in timed)
            + (f"; this invocation {total:.0f} s." if isinstance(total, (int, float)) else ".")]
