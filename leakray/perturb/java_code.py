"""Java prompts on tree-sitter-java: method bodies, their statements and declarations, and the
identifier nodes a rename replaces. Edits are text edits at node positions.

javac is stricter than the grammar, and the rules here keep insertions compilable:
- a statement after one that cannot complete normally is an error (JLS 14.22), so places
  come only after statements that always can (declarations, expression statements, loops
  whose condition is not `true`, `if` without `else`);
- `while (false)` is unreachable code, so dead loops use non-constant false conditions;
  `if (false)` is allowed (JLS 14.22's exception for conditional compilation);
- a new local must not repeat a name in scope, so every inserted name is fresh;
- declarations are never copied into a dead branch (their names would clash)."""

from __future__ import annotations

import json

from leakray.perturb.program import (Analysis, Copyable, Decl, Function, Site, indent_unit, leading_ws, new_analysis,
                                     words)

LANGUAGE = "java"
KEYWORDS = frozenset("""abstract assert boolean break byte case catch char class const continue default do double else
enum extends final finally float for goto if implements import instanceof int interface long native new package
private protected public return short static strictfp super switch synchronized this throw throws transient try
void volatile while true false null var record yield sealed permits non-sealed""".split())
# methods that usually implement or override a library contract: renaming breaks it
_CONTRACT_METHODS = frozenset("""main toString equals hashCode compareTo compare run call apply accept test get
iterator close clone finalize size isEmpty contains add remove next hasNext""".split())
_COPYABLE_EXPR = ("method_invocation", "update_expression", "assignment_expression")
_VARIABLE_BINDERS = ("formal_parameter", "catch_formal_parameter", "enhanced_for_statement")

_parser_cache: list = []


def parser():
    if not _parser_cache:
        import tree_sitter_java
        from tree_sitter import Language, Parser

        p = Parser()
        p.language = Language(tree_sitter_java.language())
        _parser_cache.append(p)
    return _parser_cache[0]


def parses(text: str) -> bool:
    return not parser().parse(text.encode("utf8")).root_node.has_error


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _probe(gp: str) -> str | None:
    """Without the reference: close every brace the prompt leaves open."""
    depth = 0
    for n in _walk(parser().parse(gp.encode("utf8")).root_node):
        if n.child_count == 0 and not n.is_missing:  # the parser's own MISSING "}" are not in the text
            depth += {"{": 1, "}": -1}.get(n.type, 0)
    probe = "\n" + "}\n" * max(depth, 0)
    return probe if parses(gp + probe) else None


def _completes_normally(s) -> bool:
    """Conservative JLS 14.22: True only where a statement after ``s`` is surely reachable."""
    t = s.type
    if t in ("local_variable_declaration", "expression_statement", "enhanced_for_statement"):
        return True
    if t == "if_statement":
        return s.child_by_field_name("alternative") is None
    if t == "for_statement":
        cond = s.child_by_field_name("condition")
        return cond is not None and cond.text.decode() != "true"
    if t == "while_statement":
        cond = s.child_by_field_name("condition")
        return cond is not None and cond.text.decode().replace(" ", "") != "(true)"
    return False


def _text(node) -> str:
    return node.text.decode("utf8")


def _type_with_dims(type_node, holder) -> str:
    dims = holder.child_by_field_name("dimensions")
    return _text(type_node) + (_text(dims) if dims is not None else "")


def _test_names(tests: str | None) -> set[str]:
    if not tests:
        return set()
    root = parser().parse(tests.encode("utf8")).root_node
    if root.has_error:
        return words(tests)
    return {_text(n) for n in _walk(root) if n.type in ("identifier", "type_identifier")}


def analyse(prompt: str, following: str | None, tests: str | None, entry_point: str | None) -> Analysis | str:
    a = new_analysis(LANGUAGE, prompt, following, _probe, parses)
    if a is None:
        return "prompt does not parse as Java (closing its braces does not complete it)"
    code = a.gen_prompt + a.following
    root = parser().parse(code.encode("utf8")).root_node
    if root.has_error:
        return "prompt + continuation does not parse as Java"
    n_lines, end_ok = a.prompt_lines, a.end_ok
    gp_bytes = len(a.gen_prompt.encode("utf8"))
    rows = code.split("\n")
    pairs: list[tuple[str, str]] = []
    methods = [n for n in _walk(root) if n.type == "method_declaration" and n.child_by_field_name("body")]
    for scope, method in enumerate(methods):
        body = method.child_by_field_name("body")
        stmts = [c for c in body.named_children if not c.type.endswith("comment")]
        close = body.children[-1]
        method_indent = leading_ws(rows[method.start_point[0]])
        if stmts and stmts[0].start_point[1] == len(leading_ws(rows[stmts[0].start_point[0]]).encode()):
            indent = leading_ws(rows[stmts[0].start_point[0]])
            pairs.append((method_indent, indent))
        else:
            indent = None  # decided once the unit is known
        site_at: dict[int, int] = {}
        for p in range(len(stmts) + 1):
            if p == 0:
                row = body.start_point[0]  # the '{'
            else:
                if not _completes_normally(stmts[p - 1]):
                    break  # and nothing later is reachable as far as we can prove
                row = stmts[p - 1].end_point[0]
            nxt = stmts[p] if p < len(stmts) else close
            line = row + 1
            if nxt.start_point[0] <= row or line > n_lines or (line == n_lines and not end_ok):
                continue
            site_at[p] = len(a.sites)
            # no statement of this body shows its indentation yet: "\0" + the method's, resolved below
            a.sites.append(Site(line, indent if indent is not None else f"\0{method_indent}", scope, p == 0))
        name = method.child_by_field_name("name")
        if method.start_byte < gp_bytes:
            a.functions.append(Function(_text(name), site_at.get(0), open=body.end_byte > gp_bytes))
        if 0 in site_at:
            params = method.child_by_field_name("parameters")
            for prm in params.named_children if params is not None else []:
                if prm.type == "formal_parameter":
                    a.decls.append(Decl(_text(prm.child_by_field_name("name")), site_at[0],
                                        _type_with_dims(prm.child_by_field_name("type"), prm)))
        for i, s in enumerate(stmts):
            if s.end_byte > gp_bytes:
                break
            if s.type == "local_variable_declaration" and i + 1 in site_at:
                type_node = s.child_by_field_name("type")
                for d in s.named_children:
                    if d.type == "variable_declarator" and d.child_by_field_name("value") is not None:
                        a.decls.append(Decl(_text(d.child_by_field_name("name")), site_at[i + 1],
                                            _type_with_dims(type_node, d)))
            later = tuple(site_at[p] for p in range(i + 1, len(stmts) + 1) if p in site_at)
            if (later and s.type == "expression_statement" and s.start_point[0] == s.end_point[0]
                    and s.named_children and s.named_children[0].type in _COPYABLE_EXPR):
                a.copyables.append(Copyable(_text(s), later))
    a.unit = indent_unit(pairs)
    a.sites = [Site(s.line, s.indent[1:] + a.unit, s.scope, s.start) if s.indent.startswith("\0") else s
               for s in a.sites]
    a.taken = words(code, tests) | KEYWORDS
    a.renamable = _renamable(root, gp_bytes, _test_names(tests), entry_point)
    return a


def _overrides(method) -> bool:
    """Declared @Override, or in a type that inherits a contract (anonymous, extends, implements)."""
    mods = next((c for c in method.children if c.type == "modifiers"), None)
    if mods is not None and "@Override" in _text(mods):
        return True
    owner = method.parent.parent if method.parent is not None else None
    if owner is None or owner.type in ("object_creation_expression", "interface_declaration", "enum_declaration"):
        return True
    return owner.type == "class_declaration" and any(
        owner.child_by_field_name(f) is not None for f in ("superclass", "interfaces"))


def _renamable(root, gp_bytes: int, test_names: set[str], entry_point: str | None) -> dict[str, str]:
    bound: dict[str, str] = {}
    methods: set[str] = set()
    # tests are another class: they see methods (and fields), never parameters or locals
    excluded = {entry_point or ""} | KEYWORDS
    for n in _walk(root):
        t = n.type
        if t == "import_declaration":
            excluded.update(_text(x) for x in _walk(n) if x.type == "identifier")
        elif t == "field_access":
            f = n.child_by_field_name("field")
            if f is not None:
                excluded.add(_text(f))
        elif t == "method_invocation" and n.child_by_field_name("object") is not None:
            if _text(n.child_by_field_name("object")) != "this":
                excluded.add(_text(n.child_by_field_name("name")))
        elif t == "method_reference":
            excluded.update(_text(x) for x in n.named_children if x.type == "identifier")
        elif t == "field_declaration":
            excluded.update(_text(d.child_by_field_name("name")) for d in n.named_children
                            if d.type == "variable_declarator")
        if n.start_byte >= gp_bytes:
            continue
        if t == "method_declaration":
            name = _text(n.child_by_field_name("name"))
            methods.add(name)
            if _overrides(n) or name in _CONTRACT_METHODS:
                excluded.add(name)
            else:
                bound.setdefault(name, "method")
        elif t in _VARIABLE_BINDERS and n.child_by_field_name("name") is not None:
            bound.setdefault(_text(n.child_by_field_name("name")), "variable")
        elif t == "variable_declarator" and n.parent is not None and n.parent.type == "local_variable_declaration":
            bound.setdefault(_text(n.child_by_field_name("name")), "variable")
        elif t == "lambda_expression":
            params = n.child_by_field_name("parameters")
            if params is not None:
                ids = [params] if params.type == "identifier" else \
                    [x for x in _walk(params) if x.type == "identifier" and x.parent.type != "formal_parameter"]
                for x in ids:
                    bound.setdefault(_text(x), "variable")
    return {name: kind for name, kind in sorted(bound.items())
            if name not in excluded and not (name in methods and name in test_names)}


def rename_edits(code: str, mapping: dict[str, str]) -> list[tuple[int, int, str]]:
    """(start, end, new) character spans of every identifier node in ``mapping`` (not `x.field`)."""
    if not mapping:
        return []
    data = code.encode("utf8")
    edits = []
    for n in _walk(parser().parse(data).root_node):
        if n.type != "identifier":
            continue
        name = data[n.start_byte:n.end_byte].decode("utf8")
        parent = n.parent
        if name in mapping and not (parent is not None and parent.type == "field_access"
                                    and parent.child_by_field_name("field") == n):
            start = len(data[:n.start_byte].decode("utf8"))
            edits.append((start, start + len(name), mapping[name]))
    return edits


# python_code.Dialect's twin on purpose: the same methods, which the kinds (perturb.core) call,
# each spelling its statement in its own language; alike in shape, they share no text.
class Dialect:
    def __init__(self, unit: str):
        self.unit = unit

    def block(self, header: str, body: list[str]) -> list[str]:
        return [f"{header} {{"] + [self.unit + line for line in body] + ["}"]

    def declare(self, name: str, expr: str, type_: str = "") -> list[str]:
        return [f"{type_ or 'var'} {name} = {expr};"]

    def constant(self, rng) -> tuple[str, str]:
        return str(rng.randint(0, 100)), "int"

    def false_condition(self) -> str:
        return "false"

    def false_comparison(self, a: int, b: int) -> str:
        return f"{a} > {b}"

    def if_(self, condition: str, body: list[str]) -> list[str]:
        return self.block(f"if ({condition})", body)

    def print_text(self, text: str) -> list[str]:
        return [f"System.out.println({json.dumps(text)});"]

    def print_var(self, name: str) -> list[str]:
        return [f"System.out.println({json.dumps(name + ' = ')} + {name});"]

    def noop(self) -> list[str]:
        return []

    def loop(self, form: str, var: str, body: list[str]) -> list[str]:
        if form == "while-false":  # `while (false)` is unreachable code to javac
            return self.block("while (Boolean.FALSE)", body)
        if form == "for-empty":
            return self.block(f"for (int {var} = 0; {var} < 0; {var}++)", body)
        if form == "while-empty-string":
            return self.block('while ("".length() > 0)', body)
        raise ValueError(form)
