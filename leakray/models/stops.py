"""Where a completion ends: at the end of the function (Python) or class (Java)."""

from __future__ import annotations

# HumanEval/Codex convention: a new top-level statement ends the function under test.
PYTHON_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", '\n"""', "\n@")


def _java_end(prompt: str, completion: str) -> int | None:
    """Index in `completion` just past the brace that closes everything the prompt opened."""
    depth, i, text = 0, 0, prompt + completion
    in_str = in_char = line_comment = block_comment = False
    start = len(prompt)
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
        elif c == "/" and nxt == "/":
            line_comment = True
        elif c == "/" and nxt == "*":
            block_comment = True
        elif c == '"':
            in_str = True
        elif c == "'":
            in_char = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and i >= start:
                return i + 1 - start
        i += 1
    return None


def cut_point(prompt: str, completion: str, language: str) -> int:
    """Characters of a raw completion that belong to the unit under test."""
    if language == "java":
        end = _java_end(prompt, completion)
        return len(completion) if end is None else end
    cut = len(completion)
    for stop in PYTHON_STOPS:
        pos = completion.find(stop)
        if pos != -1:
            cut = min(cut, pos)
    return cut


def truncate(prompt: str, completion: str, language: str) -> str:
    """Cut a raw completion where the unit under test ends."""
    return completion[: cut_point(prompt, completion, language)].rstrip() + "\n"


def stop_strings(language: str) -> list[str]:
    """Strings that let a batch stop generating early (the exact cut is `truncate`'s)."""
    return list(PYTHON_STOPS) if language == "python" else ["\n}\n}", "\n}\n\n}"]
