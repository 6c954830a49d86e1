"""Case perturbation for BUZZER-b: the prompt with its natural language upper-cased.

Only text that does nothing when run changes: Python comments and docstrings (found with
`tokenize`; also any other statement that is a string alone, prose placed like a docstring), Java line and block comments (javadoc included; found with tree-sitter-java).
Code, identifiers and every other string literal stay byte for byte, so a continuation that
completed the prompt still completes the upper-cased one. Within that text, two things stay:

- worked examples (`>>> call(...)` lines and the expected output under them, up to a blank
  line): they are code and values, and `'abc'` -> `'ABC'` would change what they say;
- the character after a backslash in a non-raw docstring or a Java comment: `\\n` -> `\\N`
  would be a syntax error in Python, and `\\u` in Java is read even inside comments.
"""

from __future__ import annotations

import io
import re
import tokenize

from leakray.errors import BadInput
from leakray.schema import T

_STRING_PREFIX = re.compile(r"^([A-Za-z]*)('''|\"\"\"|'|\")", re.S)
_BLOCK_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
_TRIVIA = {tokenize.NL, tokenize.COMMENT}


def uppercase_prompt(prompt: str, language: str) -> str:
    """`prompt` with its comments and docstrings upper-cased (examples and escapes kept).
    Code, identifiers and string literals inside expressions are unchanged byte for byte."""
    if language == "python":
        return _python(prompt)
    if language == "java":
        return _java(prompt)
    raise BadInput(f"no case perturbation for language {language!r} (expected 'python' or 'java')",
                   field=T.LANGUAGE)


def _upper_text(text: str, keep_escapes: bool) -> str:
    """Upper-case prose line by line, leaving example blocks and escaped characters as they are."""
    out, in_example = [], False
    for line in text.splitlines(keepends=True):
        bare = line.strip().lstrip("*").strip()  # a javadoc line's leading '*' is decoration
        if bare.startswith(">>>"):
            in_example = True
        elif not bare:
            in_example = False
        out.append(line if in_example else _upper_line(line, keep_escapes))
    return "".join(out)


def _upper_line(line: str, keep_escapes: bool) -> str:
    if not keep_escapes or "\\" not in line:
        return line.upper()
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            out.append(line[i:i + 2])
            i += 2
        else:
            out.append(line[i].upper())
            i += 1
    return "".join(out)


# ---- Python ----------------------------------------------------------------------------------

def _tokens(prompt: str) -> list[tokenize.TokenInfo]:
    """The prompt's tokens; a prompt cut off inside a bracket or string keeps those before it."""
    toks = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(prompt).readline):
            toks.append(tok)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return toks


def _prose_strings(toks: list[tokenize.TokenInfo]) -> list[int]:
    """Indices of the STRING tokens of statements made of string literals alone: docstrings,
    and prose placed like one (HumanEval/115 describes its task after an `import`). Such a
    statement does nothing when run, so its text is free to change; any string that is part
    of an expression (`"abc".join(x)`, `"a" if c else "b"`) is not one."""
    out: list[int] = []
    sig = [i for i, t in enumerate(toks) if t.type not in _TRIVIA]
    pos = 0
    while pos < len(sig):
        prev = toks[sig[pos - 1]] if pos else None
        if toks[sig[pos]].type != tokenize.STRING or (prev is not None and prev.type not in _BLOCK_START):
            pos += 1
            continue
        end = pos
        while end < len(sig) and toks[sig[end]].type == tokenize.STRING:
            end += 1
        if end == len(sig) or toks[sig[end]].type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            out.extend(sig[pos:end])
        pos = end
    return out


def _upper_string(token: str) -> str:
    m = _STRING_PREFIX.match(token)
    if not m:
        return token
    prefix, quote = m.group(1).lower(), m.group(2)
    if "f" in prefix or "b" in prefix:  # an f-string's braces are code; bytes are no docstring
        return token
    head = len(m.group(0))
    body = token[head:len(token) - len(quote)]
    return token[:head] + _upper_text(body, keep_escapes="r" not in prefix) + quote


def _python(prompt: str) -> str:
    toks = _tokens(prompt)
    edits = {i: "#" + _upper_text(toks[i].string[1:], keep_escapes=False)
             for i, t in enumerate(toks) if t.type == tokenize.COMMENT}
    edits.update({i: _upper_string(toks[i].string) for i in _prose_strings(toks)})
    lines = io.StringIO(prompt).readlines()  # tokenize's rows, split as it reads them
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    out, at = [], 0
    for i in sorted(edits):
        (r0, c0), (r1, c1) = toks[i].start, toks[i].end
        a, b = starts[r0 - 1] + c0, starts[r1 - 1] + c1
        out.append(prompt[at:a])
        out.append(edits[i])
        at = b
    out.append(prompt[at:])
    return "".join(out)


# ---- Java ------------------------------------------------------------------------------------

def _java(prompt: str) -> str:
    from leakray.perturb.java_code import parser

    data = prompt.encode("utf8")
    spans = []
    stack = [parser().parse(data).root_node]
    while stack:
        node = stack.pop()
        if node.type in ("line_comment", "block_comment", "comment"):
            spans.append((node.start_byte, node.end_byte))
        else:
            stack.extend(node.children)
    out, at = [], 0
    for a, b in sorted(spans):
        out.append(data[at:a])
        out.append(_upper_text(data[a:b].decode("utf8"), keep_escapes=True).encode("utf8"))
        at = b
    out.append(data[at:])
    return b"".join(out).decode("utf8")
