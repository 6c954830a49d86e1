"""Semantics-preserving rewrites of a reference *solution* (not of the prompt): the null that the
self-calibrated audit route (`leakray.evaluate.selfcal`) compares the original against.

A model that read a solution has learnt its exact spelling; a model that did not has no reason to
prefer the original's local names over other natural names for the same variables. So each rewrite
renames, consistently, every name the solution binds that nothing outside the solution can see:
locals, loop and comprehension variables, exception names, inner lambdas' parameters. The prompt is
left byte for byte as it is, so a rewrite is scored as `prompt + rewritten continuation` exactly like
the original.

Safe by construction, hence not re-run in the sandbox: a consistent renaming of names that are not
parameters, attributes, keyword arguments, module-level names, imports or names the tests mention,
in a program that does not reach its own namespace (`eval`, `exec`, `locals`, `globals`, `vars`),
computes the same thing. Python only; other languages are reported as not applicable.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import keyword
import random
import tokenize

from leakray.data.tasks import continuation, generation_prompt, program_of
from leakray.perturb.python_code import rename_edits

# ordinary names a programmer would use for a local: rewrites must be as natural as the original, or
# every model (leaked or not) would prefer the original for its naturalness alone
POOL = (
    "result", "res", "out", "output", "value", "val", "item", "items", "elem", "element", "x", "y", "z",
    "n", "m", "k", "i", "j", "idx", "index", "pos", "count", "cnt", "total", "acc", "tmp", "temp", "cur",
    "current", "prev", "nxt", "left", "right", "lo", "hi", "start", "end", "first", "last", "key", "word",
    "words", "ch", "char", "c", "s", "t", "text", "line", "parts", "part", "num", "nums", "number", "digits",
    "d", "data", "lst", "seq", "arr", "a", "b", "best", "ans", "answer", "flag", "found", "seen", "stack",
    "queue", "buf", "chunk", "size", "length", "width", "step", "level", "depth", "row", "col", "p", "q",
    "r", "u", "v", "w", "h", "g", "e", "f", "mapping", "table", "counts", "freq", "pair", "pairs", "entry",
)
_RESERVED = frozenset(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist)
_REFLECTIVE = {"eval", "exec", "locals", "globals", "vars", "__import__", "compile", "getattr", "setattr"}


def _names(code: str) -> set[str]:
    try:
        return {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME}
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return set(code.split())


def renamable_locals(prompt: str, reference: str, tests: str = "") -> list[str] | str:
    """Names bound in the solution's body that a consistent rename cannot change the meaning of,
    sorted; or why the task has none."""
    cont = continuation(prompt, reference)
    if not cont.strip():
        return "the reference adds nothing to the prompt"
    gp = generation_prompt(prompt)
    code = program_of(prompt, cont)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        return f"prompt + reference does not parse: {getattr(exc, 'msg', exc)}"
    n_prompt_lines = gp.count("\n") + 1
    seen_outside = _names(gp) | _names(tests)
    bound: set[str] = set()
    excluded: set[str] = set()
    for stmt in tree.body:  # module-level bindings are visible to the tests
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            excluded.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name))
        else:
            excluded.add(stmt.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in _REFLECTIVE:
            return f"the program calls {node.id}(): renaming could change what it computes"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            excluded.update((al.asname or al.name).split(".")[0] for al in node.names)
        elif isinstance(node, ast.Attribute):
            excluded.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            excluded.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            excluded.update(node.names)
        elif isinstance(node, ast.JoinedStr):  # conservative across tokenizer versions
            excluded.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ClassDef):
            excluded.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # called by name; parameters by keyword
            excluded.add(node.name)
            excluded.update(a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs)
        if getattr(node, "lineno", 0) <= n_prompt_lines:
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Lambda):
            bound.update(a.arg for a in node.args.args)
    names = sorted(n for n in bound - excluded - seen_outside
                   if n not in _RESERVED and not (n.startswith("__") and n.endswith("__")))
    return names or "the solution binds no local name that only it uses"


def solution_rewrites(prompt: str, reference: str, tests: str = "", n: int = 16, seed: int = 0,
                      key: str = "") -> list[str] | str:
    """Up to ``n`` distinct rewritten references (full programs, prompt unchanged), each a random
    consistent renaming of every renamable local to natural names the program does not use; or why
    none can be made. Seeded by (seed, key), so a task's rewrites are the same in every run."""
    names = renamable_locals(prompt, reference, tests)
    if isinstance(names, str):
        return names
    cont = continuation(prompt, reference)
    code = program_of(prompt, cont)
    head = len(code) - len(cont)
    taken = _names(code) | _names(tests) | _RESERVED
    pool = [p for p in POOL if p not in taken]
    if len(pool) < len(names):
        return f"too few unused natural names for {len(names)} locals"
    rng = random.Random(int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big"))
    out: list[str] = []
    seen = {cont}
    for _ in range(n * 4):
        if len(out) == n:
            break
        mapping = dict(zip(names, rng.sample(pool, len(names))))
        edits = rename_edits(code, mapping)
        if any(start < head for start, _, _ in edits):  # the prompt never changes (checked, not assumed)
            return "a renamed name occurs in the prompt"
        text = code
        for start, end, new in sorted(edits, reverse=True):
            text = text[:start] + new + text[end:]
        new_cont = text[head:]
        if new_cont in seen:
            continue
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        seen.add(new_cont)
        out.append(text)
    return out or "no distinct rewrite could be made"
