"""Where a completion ends, as a property of its task's prompt and language.

A completion continues the *generation prompt* (the prompt without trailing whitespace,
see `leakray.data.tasks`). What it must add depends on where that prompt stops:

- ``body``: the prompt ends inside a block it opened (HumanEval: a signature and a
  docstring; HumanEval-X/MBJP Java: a method inside a class). The completion ends where
  that block ends: Python, at the first code line indented no deeper than the block's
  outermost header (comment lines just before it go with it); Java, at the brace that
  closes everything the prompt left open (the method, then its class).
- ``module``: the prompt is complete at top level (a docstring or comment describing
  the task: MBPP, ClassEval, NaturalCodeBench, APPS, EvoCodeBench without a signature).
  The completion is a whole program (imports, helpers, classes), so only a new top-level
  task description ends it: a top-level triple-quoted string (Python) or a plain ``/*``
  block comment (Java, not ``/**`` javadoc), *after the program's first code line*: a
  program may open with its own header (a licence block, a module docstring), which is
  not a new task; otherwise it runs to end of sequence.

`cut_point`/`truncate` apply the rule exactly. `stop_strings` are only what lets
generation stop early; each one marks a point where `truncate` would also cut, and none
occurs inside a reference before its end (tests/test_stops.py checks every benchmark).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

BODY, MODULE = "body", "module"

# Early stops, all lines that start at column 0: each is a top-level statement that ends a
# body (the exact cut, after comments, is `cut_point`'s).
_PY_BODY_STOPS = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\nassert ", "\n@", '\n"""', "\nfrom ", "\nimport ")
# A module's stops mark a new task laid out as the prompts are (the opener alone on its line) and
# carry what comes before it: a blank line (Python), a class's closing brace (Java). A continuation
# opens with one newline, so a program's own header (a module docstring, a licence block) does not
# match, nor does the closing quote of a string that spans lines (`X = """` ... `"""` at column 0)
# unless a blank line ends that string (`stop_rule_breaks` names any reference where that happens).
_PY_MODULE_STOPS = ('\n\n"""\n', "\n\n'''\n")
_JAVA_BODY_STOPS = ("\n}",)  # a brace at column 0 closes a class in conventionally laid out code
_JAVA_MODULE_STOPS = ("\n}\n/*\n", "\n}\n\n/*\n")
_DOCSTRING = re.compile(r"[rRbBuU]{0,2}(\"\"\"|''')")


@dataclass(frozen=True)
class Scope:
    kind: str  # BODY | MODULE
    indent: int = 0  # Python body: a code line at this column or left of it ends the unit


@dataclass
class _Line:
    """A Python logical line (continuation lines inside brackets/strings are not lines)."""

    start: int
    indent: int
    kind: str  # "code" | "comment" | "blank"
    head: str  # the first characters, stripped
    last: str = ""  # the last code character (outside comments)


def _py_lines(text: str) -> list[_Line]:
    """Logical lines of (possibly broken) Python, aware of strings, brackets and comments."""
    lines: list[_Line] = []
    quote, depth, cont, at_start = None, 0, False, True
    cur: _Line | None = None
    i, n = 0, len(text)
    while i < n:
        if at_start:
            at_start = False
            if quote is None and depth == 0 and not cont:
                j = i
                while j < n and text[j] in " \t\f":
                    j += 1
                c = text[j] if j < n else "\n"
                kind = "blank" if c in "\r\n" else "comment" if c == "#" else "code"
                cur = _Line(i, len(text[i:j].expandtabs(8)), kind, text[j:j + 8])
                lines.append(cur)
            cont = False
        c = text[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            if c == "\n":
                if len(quote) == 1:  # unterminated single-quoted string: recover at the line's end
                    quote = None
                at_start = True
            i += 1
            continue
        if c == "#":
            end = text.find("\n", i)
            i = n if end == -1 else end
            continue
        if c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote)
            if cur is not None:
                cur.last = c
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif c == "\\" and text.startswith("\n", i + 1):
            cont = True
        elif c == "\n":
            at_start = True
        if cur is not None and c not in " \t\r\n\f\\":
            cur.last = c
        i += 1
    return lines


def _java_scan(text: str, start: int, module: bool) -> tuple[int | None, int]:
    """(index in `text`, at or after `start`, where a Java unit ends, or None; braces still
    open at the end). A body ends just past the brace that closes everything opened before
    `start`; a module at the start of a top-level line that opens a plain block comment."""
    depth, i = 0, 0
    in_str = in_char = line_comment = block_comment = False
    code_seen = False  # in the completion: a module's own leading comments are not a new task
    while i < len(text):
        c, nxt = text[i], text[i + 1: i + 2]
        if line_comment:
            line_comment = c != "\n"
        elif block_comment:
            if c == "*" and nxt == "/":
                block_comment, i = False, i + 1
        elif in_str or in_char:
            if c == "\\":
                i += 1
            elif (in_str and c == '"') or (in_char and c == "'"):
                in_str = in_char = False
            elif c == "\n":  # unterminated literal: recover at the line's end
                in_str = in_char = False
        elif c == "/" and nxt == "/":
            line_comment = True
        elif c == "/" and nxt == "*":
            block_comment = True
        else:
            code_seen = code_seen or (i >= start and not c.isspace())
            if c == '"':
                in_str = True
            elif c == "'":
                in_char = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth = max(0, depth - 1)
                if not module and depth == 0 and i >= start:
                    return i + 1, 0
        if c == "\n" and module and depth == 0 and not block_comment and code_seen:
            rest = text[i + 1:i + 200].lstrip(" \t")
            if rest.startswith("/*") and not rest.startswith("/**"):
                return i + 1, 0
        i += 1
    return None, depth


def _base(prompt: str) -> str:
    return prompt.rstrip()  # = leakray.data.tasks.generation_prompt (kept local: no import cycle)


@lru_cache(maxsize=4096)
def completion_scope(prompt: str, language: str) -> Scope:
    """Where a completion of `prompt` ends (see the module docstring)."""
    base = _base(prompt)
    if language == "java":
        return Scope(BODY) if _java_scan(base, len(base) + 1, module=False)[1] else Scope(MODULE)
    code = [ln for ln in _py_lines(base) if ln.kind == "code"]
    if not code:
        return Scope(MODULE)
    indent = min(ln.indent for ln in code)
    header = [ln for ln in code if ln.indent == indent][-1]
    if header.last == ":":  # the prompt's last top-level statement is a block it is inside of
        return Scope(BODY, indent)
    return Scope(MODULE, indent)


def cut_point(prompt: str, completion: str, language: str) -> int:
    """Characters of a raw completion that belong to the unit under test."""
    base = _base(prompt)
    scope = completion_scope(prompt, language)
    text = base + completion
    if language == "java":
        end, _ = _java_scan(text, len(base), module=scope.kind == MODULE)
        return len(completion) if end is None else max(0, end - len(base))
    lines = _py_lines(text)
    first = next((k for k, ln in enumerate(lines) if ln.start > len(base)), len(lines))
    code_seen = False  # a module's docstrings before its first code line are its own header
    for k in range(first, len(lines)):
        ln = lines[k]
        if ln.kind != "code":
            continue
        docstring = _DOCSTRING.match(ln.head)
        if ln.indent > scope.indent or (scope.kind == MODULE and not (docstring and code_seen)):
            code_seen = code_seen or not docstring
            continue
        # comment and blank lines just before the end go with what follows it
        while k > first and (lines[k - 1].kind == "blank" or
                             (lines[k - 1].kind == "comment" and lines[k - 1].indent <= scope.indent)):
            k -= 1
        return lines[k].start - len(base)
    return len(completion)


def truncate(prompt: str, completion: str, language: str) -> str:
    """Cut a raw completion where the unit under test ends."""
    return completion[: cut_point(prompt, completion, language)].rstrip() + "\n"


def stop_strings(prompt: str, language: str) -> list[str]:
    """Strings that let generation stop early (the exact cut is `truncate`'s)."""
    kind = completion_scope(prompt, language).kind
    if language == "java":
        return list(_JAVA_BODY_STOPS if kind == BODY else _JAVA_MODULE_STOPS)
    return list(_PY_BODY_STOPS if kind == BODY else _PY_MODULE_STOPS)


def server_stops(prompt: str, language: str) -> list[str]:
    """The stop strings a server may drop from the text it returns (OpenAI's `stop`): those where the
    unit ends before any visible character of the stop. Not Java's closing braces, which the unit
    keeps. Each is tried after a line of the unit's code, as it only ever fires after code."""
    scope = completion_scope(prompt, language)
    lead = "\n;" if language == "java" else "\n" + " " * (scope.indent + (4 if scope.kind == BODY else 0)) + "pass"
    out = []
    for stop in stop_strings(prompt, language):
        cut = cut_point(prompt, lead + stop, language)
        if len(lead) <= cut < len(lead) + len(stop) and not stop[:cut - len(lead)].strip():
            out.append(stop)
    return out


def stop_rule_breaks(prompt: str, reference: str, language: str) -> list[str]:
    """Why a verbatim copy of the reference would not survive as a completion ([] when it would):
    `truncate` cuts it short, or a stop string would end generation before its end."""
    from leakray.data.tasks import continuation

    cont = continuation(prompt, reference)
    end = len(cont.rstrip())
    breaks = []
    kept = len(truncate(prompt, cont, language).rstrip())
    if kept != end:
        breaks.append(f"truncate keeps {kept} of its {end} characters")
    for stop in stop_strings(prompt, language):
        at = cont.find(stop)  # later occurrences end later still
        if at != -1 and at + len(stop) < end:
            breaks.append(f"stop string {stop!r} occurs at character {at} of {end}")
    return breaks
