"""What happened to a run's rows, from its stages' markers: rows degraded or failed for good (by
reason), rows a collection tried again, rows read back from a killed attempt, and what an endpoint
was asked for. The same lines in report.md and report.html (markdown's backticks dropped there)."""

from __future__ import annotations


def row_errors_line(stages: dict) -> list[str]:
    """Degraded rows, and rows that failed for good (no verdict: ids in <stage>/errors.parquet)."""
    errors = {name: st["errors"] for name, st in stages.items() if st.get("errors")}
    if not errors:
        return []
    return ["", "Row errors by stage: " + "; ".join(f"{name} {e}" for name, e in errors.items())]


def row_retries_line(stages: dict) -> list[str]:
    """The rows a collection tried again after a failure another attempt can cure, where any."""
    again = {name: st["row_retries"] for name, st in stages.items() if (st.get("row_retries") or {}).get("rows")}
    if not again:
        return []
    return ["", "Rows collected again after a failure another attempt can cure (`sample.row_retries`): " + "; ".join(
        f"{name} {v['rows']}, of which {v['recovered']} went through" for name, v in again.items())]


def resumed_line(stages: dict) -> list[str]:
    """The rows a collection read back from a killed attempt of itself instead of collecting them again."""
    back = {name: st for name, st in stages.items() if st.get("resumed_rows")}
    if not back:
        return []
    return ["", "Rows read back from a killed attempt of the stage (not collected again): " + "; ".join(
        f"{name} {st['resumed_rows']} of {st.get('rows_in', '?')}" for name, st in back.items())]


def endpoint_usage_line(stages: dict) -> list[str]:
    """What each collection through an endpoint asked it for (`protocols.collection.endpoint_usage`):
    on a hosted API, what the audit was billed for."""
    used = {name: st for name, st in stages.items() if st.get("endpoint_usage")}
    if not used:
        return []

    def one(name: str, st: dict) -> str:
        u, tasks = st["endpoint_usage"], st.get("rows_in")
        tokens = (f", {u.get('prompt_tokens', 0):,} prompt and {u.get('completion_tokens', 0):,} generated tokens "
                  "as its answers counted them" if u.get("prompt_tokens") or u.get("completion_tokens")
                  else ", its answers counted no tokens")
        # per task: what another benchmark of n tasks would cost with the same settings
        each = f", {u.get('requests', 0) / tasks:.1f} requests per task" if tasks else ""
        # the plan's count (`--plan`): what the settings ask, every request answered the first time
        plan = f"; the plan counted {u['planned']:,}" if u.get("planned") is not None else ""
        return f"{name} {u.get('requests', 0):,} requests ({u.get('retries', 0):,} of them retries{each}{plan}){tokens}"

    return ["", "Asked of the endpoint (every attempt of the stage; a batch a kill cut short is left out): "
            + "; ".join(one(name, st) for name, st in used.items())]


def row_lines(stages: dict) -> list[str]:
    return row_errors_line(stages) + row_retries_line(stages) + resumed_line(stages) + endpoint_usage_line(stages)
