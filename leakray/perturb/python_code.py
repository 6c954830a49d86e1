"""Python prompts: the standard `ast` finds statements, bodies and bindings; `tokenize` finds
the name tokens a rename replaces. Every edit is a text edit, so comments, docstrings and
layout outside the inserted lines stay byte for byte."""

from __future__ import annotations

import ast
import builtins
import io
import keyword
import tokenize

from leakray.perturb.program import (Analysis, Copyable, Decl, Function, Site, indent_unit, leading_ws, new_analysis,
                                     words)

LANGUAGE = "python"
_BUILTINS = frozenset(dir(builtins))
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COPYABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Import, ast.ImportFrom)
# In a copied statement these change what the function is (a generator, a coroutine) or
# which scope a name belongs to, even when never executed.
_SCOPE_CHANGING = (ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr, ast.Global, ast.Nonlocal)


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):  # ValueError: NUL bytes
        return False
    return True


def _probe(gp: str) -> str | None:
    """Without the reference, a `pass` at the indentation the completion most likely
    continues at stands in for it (HumanEval: the function body after the docstring)."""
    rows = [r for r in gp.split("\n") if r.strip()]
    if not rows:
        return None
    last = rows[-1]
    ind = leading_ws(last)
    candidates = ([ind + "    "] if last.rstrip().endswith(":") else []) + [ind, ""]
    for c in candidates:
        probe = "\n" + c + "pass\n"
        if parses(gp + probe):
            return probe
    return None


def _first_line(stmt: ast.stmt) -> int:
    decorators = getattr(stmt, "decorator_list", None) or []
    return min([stmt.lineno] + [d.lineno for d in decorators])


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _test_names(tests: str | None) -> tuple[set[str], set[str]]:
    """(every name token of the tests, the keyword-argument names they pass); when the tests do
    not parse, every word of them for both (conservative)."""
    if not tests:
        return set(), set()
    try:
        tree = ast.parse(tests)
        names = {t.string for t in tokenize.generate_tokens(io.StringIO(tests).readline) if t.type == tokenize.NAME}
    except (SyntaxError, ValueError, tokenize.TokenError):
        return words(tests), words(tests)
    kwargs = {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg}
    if any(isinstance(n, ast.keyword) and n.arg is None for n in ast.walk(tree)):  # f(**d): any name
        kwargs |= names
    return names, kwargs


def analyse(prompt: str, following: str | None, tests: str | None, entry_point: str | None) -> Analysis | str:
    """The prompt's sites, declarations, copyable statements and renamable names, or why not."""
    a = new_analysis(LANGUAGE, prompt, following, _probe, parses)
    if a is None:
        return "prompt does not parse as Python (no continuation makes it complete)"
    code = a.gen_prompt + a.following
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        return f"prompt + continuation does not parse as Python: {getattr(exc, 'msg', exc)}"
    n_lines, end_ok = a.prompt_lines, a.end_ok
    rows = code.split("\n")
    pairs: list[tuple[str, str]] = []
    bodies = [(tree.body, None)] + [(n.body, n) for n in ast.walk(tree) if isinstance(n, _FUNCS)]
    for scope, (stmts, func) in enumerate(bodies):
        if not stmts:
            continue
        indent = leading_ws(rows[stmts[0].lineno - 1]) if func is not None else ""
        if stmts[0].col_offset != len(indent.encode()):  # `def f(): return 1`: no line to insert on
            continue
        if func is not None:
            pairs.append((leading_ws(rows[func.lineno - 1]), indent))
        k0 = 0
        if _is_docstring(stmts[0]):
            k0 = 1
        if func is None:  # `from __future__` must stay first
            while k0 < len(stmts) and isinstance(stmts[k0], ast.ImportFrom) and stmts[k0].module == "__future__":
                k0 += 1
        site_at: dict[int, int] = {}  # position p (before stmts[p]) -> site index
        for p in range(k0, len(stmts) + 1):
            line = stmts[p - 1].end_lineno if p > 0 else _first_line(stmts[0]) - 1
            if p < len(stmts) and _first_line(stmts[p]) <= line:  # `a = 1; b = 2` on one line
                continue
            if line > n_lines or (line == n_lines and not end_ok):
                continue
            site_at[p] = len(a.sites)
            a.sites.append(Site(line, indent, scope, start=func is not None and p == k0))
        if func is not None:
            args = func.args
            params = [x.arg for x in args.posonlyargs + args.args + args.kwonlyargs]
            params += [x.arg for x in (args.vararg, args.kwarg) if x is not None]
            if k0 in site_at:
                a.decls += [Decl(name, site_at[k0]) for name in params]
            if _first_line(func) <= n_lines:
                a.functions.append(Function(func.name, site_at.get(k0), open=func.end_lineno > n_lines))
        for i in range(k0, len(stmts)):
            s = stmts[i]
            if s.end_lineno > n_lines:
                break
            if i + 1 in site_at:
                for name in _declared(s):
                    a.decls.append(Decl(name, site_at[i + 1]))
            later = tuple(site_at[p] for p in range(i + 1, len(stmts) + 1) if p in site_at)
            if later and _copyable(s, func is not None):
                a.copyables.append(Copyable(ast.get_source_segment(code, s), later))
    a.unit = indent_unit(pairs)
    a.taken = words(code, tests) | _BUILTINS | set(keyword.kwlist) | set(keyword.softkwlist)
    a.renamable = _renamable(tree, n_lines, _test_names(tests), entry_point)
    return a


def _declared(s: ast.stmt) -> list[str]:
    """Names a simple declaration certainly binds (so reading them right after is safe)."""
    if isinstance(s, ast.Assign):
        out = []
        for target in s.targets:
            elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            if all(isinstance(e, ast.Name) for e in elts):
                out += [e.id for e in elts]
        return out
    if isinstance(s, ast.AnnAssign) and s.value is not None and isinstance(s.target, ast.Name):
        return [s.target.id]
    return []


def _copyable(s: ast.stmt, in_function: bool) -> bool:
    if not isinstance(s, _COPYABLE) or s.lineno != s.end_lineno:
        return False
    if isinstance(s, ast.Expr) and not isinstance(s.value, ast.Call):
        return False  # docstrings and bare names
    if isinstance(s, ast.Return) and not in_function:
        return False
    if isinstance(s, ast.ImportFrom) and s.module == "__future__":
        return False
    return not any(isinstance(n, _SCOPE_CHANGING) for n in ast.walk(s))


def _renamable(tree: ast.Module, n_lines: int, tests: tuple[set[str], set[str]],
               entry_point: str | None) -> dict[str, str]:
    """Names the prompt binds whose every use is a plain name token we can rename together.

    Tests see the program's module-level names (def names included) and, through keyword
    arguments, its parameters; a function's other locals are invisible to them."""
    test_names, test_kwargs = tests
    bound: dict[str, str] = {}
    exposed: set[str] = set()  # module-level names and def names
    params: set[str] = set()
    excluded = {entry_point or ""}
    for stmt in tree.body:
        for node in ast.walk(stmt) if not isinstance(stmt, _FUNCS + (ast.ClassDef,)) else [stmt]:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                exposed.add(node.id)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        in_prompt = line is not None and line <= n_lines
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            excluded.update((al.asname or al.name).split(".")[0] for al in node.names)
        elif isinstance(node, ast.Attribute):
            excluded.add(node.attr)  # obj.name: not ours to rename
        elif isinstance(node, ast.keyword) and node.arg:
            excluded.add(node.arg)  # f(name=...): the callee's parameter
        elif isinstance(node, ast.JoinedStr):  # f-string expressions are one STRING token in 3.11
            excluded.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ClassDef):
            excluded.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            pass  # renamed with the rest; the name tokens are ordinary NAMEs
        if not in_prompt:
            continue
        if isinstance(node, _FUNCS):
            bound.setdefault(node.name, "method")
            exposed.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.setdefault(node.id, "variable")
        elif isinstance(node, ast.arg):
            bound.setdefault(node.arg, "variable")
            params.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.setdefault(node.name, "variable")
    excluded |= (exposed & test_names) | (params & test_kwargs)
    return {
        name: kind for name, kind in sorted(bound.items())
        if name not in excluded and name not in _BUILTINS and not keyword.iskeyword(name)
        and not keyword.issoftkeyword(name) and not (name.startswith("__") and name.endswith("__"))
        and name != "self" and name != "cls"
    }


def rename_edits(code: str, mapping: dict[str, str]) -> list[tuple[int, int, str]]:
    """(start, end, new) character spans of every name token in ``mapping`` that is not an attribute."""
    if not mapping:
        return []
    offsets = [0]
    for line in code.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    edits = []
    prev = None
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.NAME and tok.string in mapping and not (prev is not None and prev.string == "."):
            pos = offsets[tok.start[0] - 1] + tok.start[1]
            edits.append((pos, pos + len(tok.string), mapping[tok.string]))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            prev = tok
    return edits


# ---- how the kinds spell their statements in Python ------------------------------------------
# java_code.Dialect is its twin on purpose: the same methods, which the kinds (perturb.core) call,
# each spelling its statement in its own language; alike in shape, they share no text.
class Dialect:
    unit = "    "

    def __init__(self, unit: str):
        self.unit = unit

    def block(self, header: str, body: list[str]) -> list[str]:
        return [f"{header}:"] + [self.unit + line for line in (body or ["pass"])]

    def declare(self, name: str, expr: str, type_: str = "") -> list[str]:
        return [f"{name} = {expr}"]

    def constant(self, rng) -> tuple[str, str]:
        return str(rng.randint(0, 100)), ""

    def false_condition(self) -> str:
        return "False"

    def false_comparison(self, a: int, b: int) -> str:
        return f"{a} > {b}"  # a < b by construction

    def if_(self, condition: str, body: list[str]) -> list[str]:
        return self.block(f"if {condition}", body)

    def print_text(self, text: str) -> list[str]:
        return [f"print({text!r})"]

    def print_var(self, name: str) -> list[str]:
        return [f"print({name + ' =' !r}, {name})"]

    def noop(self) -> list[str]:
        return ["pass"]

    def loop(self, form: str, var: str, body: list[str]) -> list[str]:
        if form == "while-false":
            return self.block("while False", body)
        if form == "for-empty":
            return self.block(f"for {var} in range(0)", body)
        if form == "while-empty-string":
            return self.block('while len("") > 0', body)
        raise ValueError(form)
