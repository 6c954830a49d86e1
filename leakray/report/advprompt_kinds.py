"""The line a report prints when AdvPrompt-MIA's variants came from fewer kinds than the paper's five."""

from __future__ import annotations


def advprompt_kinds_line(config: dict | None, detectors) -> list[str]:
    """``config`` is the run's config dump, ``detectors`` the names the report lists."""
    from leakray.perturb.core import KINDS  # the paper's kinds; a report module may not import leakray.config

    columns = (config or {}).get("columns") or {}
    kinds = columns.get("advprompt_kinds")
    if not columns.get("advprompt") or not kinds or list(kinds) == list(KINDS) \
            or not any(name.startswith("advprompt") for name in detectors):
        return []
    return ["", f"AdvPrompt-MIA completed the variants of {', '.join(kinds)} only (`columns.advprompt_kinds`; "
                "the paper's are all five): the other kinds' slots are missing, as an inapplicable variant's are."]
