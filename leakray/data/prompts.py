"""Natural-language prompts as code prefixes, so `prompt + completion` is always a program."""

from __future__ import annotations

import logging

log = logging.getLogger("leakray.data")


def as_comment(text: str, language: str) -> str:
    """`text` as a leading docstring (Python) or block comment (Java)."""
    if language == "java":
        return "/*\n" + text.strip().replace("*/", "* /") + "\n*/\n"
    return '"""\n' + text.strip().replace("\\", "\\\\").replace('"""', "'''") + '\n"""\n'


def report_skipped(path, what: str, ids: list) -> None:
    """Rows a reader cannot turn into tasks are named, never dropped silently."""
    if ids:
        shown = ", ".join(map(str, ids[:20])) + (" ..." if len(ids) > 20 else "")
        log.warning("%s: skipped %d rows %s: %s", path, len(ids), what, shown)
