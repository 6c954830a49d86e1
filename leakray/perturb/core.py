"""The five semantics-preserving perturbation kinds of AdvPrompt-MIA (Algorithm 1), 11 variants.

Every function here is pure and seeded: the same prompt, kind, variant and seed give the same
text on every machine (seeds are hashed with sha256, never Python's salted `hash`).

- IDC dead control branch (2): two of four forms drawn per prompt -- `if False` or an
  always-false comparison, guarding an assignment to a fresh variable or a copy of a
  statement of the same body;
- IRV redundant variable (2): from an existing variable right after the line that declares
  it; from a constant at a random place;
- VR rename (2): one variable; one method (else another variable, else the same one again
  under another name);
- IDP debug print (2): at the start of the body the completion continues; after a variable
  declaration, printing it;
- IDL dead loop (3): `while False` / an empty `for` / a false length comparison, the body
  drawn from print, pass, assignment.

A variant is checked against the code that follows it: with the reference, ``prompt +
continuation`` (renamed for VR) must parse; without it, a stand-in that closes the open body.
Where a kind cannot apply, the result is a ``NotApplicable`` that says why.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

from leakray.data.tasks import continuation, generation_prompt
from leakray.errors import BadInput
from leakray.perturb.program import Analysis
from leakray.schema import LANGUAGES, T

KINDS = ("IDC", "IRV", "VR", "IDP", "IDL")
N_VARIANTS = {"IDC": 2, "IRV": 2, "VR": 2, "IDP": 2, "IDL": 3}
SLOTS: tuple[tuple[str, int], ...] = tuple((k, i) for k in KINDS for i in range(N_VARIANTS[k]))  # the 11
FORMS = {
    "IDC": ("if-false-assign", "if-compare-assign", "if-false-copy", "if-compare-copy"),
    "IRV": ("from-variable", "from-constant"),
    "VR": ("variable", "method"),
    "IDP": ("body-start", "after-declaration"),
    "IDL": ("while-false", "for-empty", "while-empty-string"),
}
_NAMES = ("tmp", "temp", "aux", "unused", "dummy", "val", "flag")


def slot_name(kind: str, index: int) -> str:
    return f"{kind}{index + 1}"


class _Slotted:
    """What a Variant and a NotApplicable share: they stand for one slot (kind, index) of a task."""

    kind: str
    index: int

    @property
    def slot(self) -> str:
        return slot_name(self.kind, self.index)


@dataclass(frozen=True)
class Variant(_Slotted):
    """A perturbed prompt. ``rename`` (old, new) pairs are applied to the reference too."""

    kind: str
    index: int
    form: str
    language: str
    prompt: str
    rename: tuple[tuple[str, str], ...] = ()
    detail: str = ""

    @property
    def applicable(self) -> bool:
        return True

    def reference_continuation(self, reference_continuation: str) -> str:
        """The original reference continuation, renamed as this variant's prompt was."""
        if not self.rename:
            return reference_continuation
        gp = generation_prompt(self.prompt)
        code = gp + reference_continuation
        edits = [e for e in _lang(self.language).rename_edits(code, dict(self.rename)) if e[0] >= len(gp)]
        return apply_edits(code, edits)[len(gp):]

    def reference(self, reference_continuation: str) -> str:
        """The complete reference program for this variant (task schema: prompt + continuation)."""
        return generation_prompt(self.prompt) + self.reference_continuation(reference_continuation)


@dataclass(frozen=True)
class NotApplicable(_Slotted):
    kind: str
    index: int
    language: str
    reason: str

    @property
    def applicable(self) -> bool:
        return False


def _lang(language: str) -> ModuleType:
    if language == "python":
        from leakray.perturb import python_code
        return python_code
    if language == "java":
        from leakray.perturb import java_code
        return java_code
    raise BadInput(f"unknown language {language!r} (expected one of {LANGUAGES})", field=T.LANGUAGE)


def apply_edits(text: str, edits: list[tuple[int, int, str]]) -> str:
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return text


def _rng(*parts) -> random.Random:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@lru_cache(maxsize=256)
def _analysis(prompt: str, language: str, reference: str | None, entry_point: str | None,
              tests: str | None) -> Analysis | str:
    following = None
    if reference is not None:
        if not reference.startswith(generation_prompt(prompt)):
            return "the reference does not continue the prompt (a perturbed prompt has no reference to check)"
        following = continuation(prompt, reference)
    return _lang(language).analyse(prompt, following, tests, entry_point)


def perturb(prompt: str, language: str, kind: str, variant: int, seed: int = 0, *,
            reference: str | None = None, entry_point: str | None = None,
            tests: str | None = None) -> Variant | NotApplicable:
    """Variant ``variant`` (0-based) of perturbation ``kind`` of ``prompt``.

    ``reference`` (the complete reference program, task schema) lets insertions be checked
    against the code that really follows, and renames avoid its names; ``entry_point`` and
    ``tests`` name what a rename must never touch. Without them, the result still parses
    when the prompt's open body is closed, but a rename could hit a name only the tests use."""
    _lang(language)
    if kind not in N_VARIANTS:
        raise BadInput(f"unknown perturbation kind {kind!r} (expected one of {KINDS})")
    if not 0 <= variant < N_VARIANTS[kind]:
        raise BadInput(f"{kind} has variants 0..{N_VARIANTS[kind] - 1}, not {variant}")
    a = _analysis(prompt, language, reference, entry_point or None, tests or None)
    if isinstance(a, str):
        return NotApplicable(kind, variant, language, a)
    dialect = _lang(language).Dialect(a.unit)
    kind_rng = _rng(seed, language, kind, a.gen_prompt)
    rng = _rng(seed, language, kind, variant, a.gen_prompt)
    return _KIND_FUNCS[kind](a, dialect, variant, kind_rng, rng)


def perturb_task(task: dict, kind: str, variant: int, seed: int = 0) -> Variant | NotApplicable:
    return perturb(task[T.PROMPT], task[T.LANGUAGE], kind, variant, seed, reference=task[T.REFERENCE],
                   entry_point=task.get(T.ENTRY_POINT) or None, tests=task.get(T.TESTS) or None)


def variants_of(task: dict, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> list[Variant | NotApplicable]:
    """Algorithm 1: every slot of the requested kinds (all 11 by default), in slot order."""
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise BadInput(f"unknown perturbation kinds {sorted(unknown)} (expected some of {KINDS})")
    return [perturb_task(task, k, i, seed) for k, i in SLOTS if k in kinds]


# ---- the kinds -------------------------------------------------------------------------------
def _insert_somewhere(a: Analysis, kind: str, index: int, form: str, rng: random.Random,
                      site_ids, make_lines) -> Variant | NotApplicable:
    """Insert at the first of the (shuffled) sites where the result still parses."""
    order = list(site_ids)
    if not order:
        return NotApplicable(kind, index, a.language, f"{form}: no place in the prompt to insert a statement")
    rng.shuffle(order)
    for sid in order:
        site = a.sites[sid]
        lines = make_lines()
        prompt = a.insert(site, lines)
        if a.checks(prompt):
            return Variant(kind, index, form, a.language, prompt,
                           detail=f"after prompt line {site.line}: {lines[0].strip()}")
    return NotApplicable(kind, index, a.language, f"{form}: no place where the inserted code still parses")


def _idc(a: Analysis, d, index: int, kind_rng: random.Random, rng: random.Random):
    forms = [f for f in FORMS["IDC"] if a.sites and (not f.endswith("copy") or a.copyables)]
    kind_rng.shuffle(forms)  # Algorithm 1: pick two forms per prompt
    if index >= len(forms):
        return NotApplicable("IDC", index, a.language, f"only {len(forms)} IDC forms apply to this prompt")
    form = forms[index]
    lo = rng.randint(0, 9)
    hi = lo + rng.randint(1, 9)
    cond = d.false_condition() if form.startswith("if-false") else d.false_comparison(lo, hi)  # lo > hi
    if form.endswith("copy"):
        stmt = rng.choice(a.copyables)
        return _insert_somewhere(a, "IDC", index, form, rng, stmt.sites, lambda: d.if_(cond, [stmt.text]))
    reserved: set[str] = set()
    value, type_ = d.constant(rng)
    name = a.fresh(rng.choice(_NAMES), rng, reserved)
    return _insert_somewhere(a, "IDC", index, form, rng, range(len(a.sites)),
                             lambda: d.if_(cond, d.declare(name, value, type_)))


def _irv(a: Analysis, d, index: int, kind_rng: random.Random, rng: random.Random):
    form = FORMS["IRV"][index]
    name = a.fresh(rng.choice(_NAMES), rng, set())
    if form == "from-variable":
        if not a.decls:
            return NotApplicable("IRV", index, a.language, "from-variable: the prompt declares no variable "
                                 "(no parameter or simple assignment in a body with a place after it)")
        decl = rng.choice(a.decls)
        return _insert_somewhere(a, "IRV", index, form, rng, [decl.site],
                                 lambda: d.declare(name, decl.name, decl.type))
    value, type_ = d.constant(rng)
    return _insert_somewhere(a, "IRV", index, form, rng, range(len(a.sites)), lambda: d.declare(name, value, type_))


def _vr_choices(a: Analysis, kind_rng: random.Random) -> list[tuple[str, str] | None]:
    variables = sorted(n for n, k in a.renamable.items() if k == "variable")
    methods = sorted(n for n, k in a.renamable.items() if k == "method")
    first = ("variable", kind_rng.choice(variables)) if variables else None
    if methods:
        second = ("method", kind_rng.choice(methods))
    else:
        others = [v for v in variables if first is None or v != first[1]]
        # one variable only: rename it again under another fresh name (a second draw, not a skip)
        second = ("variable", kind_rng.choice(others)) if others else first
    return [first, second]


def _vr(a: Analysis, d, index: int, kind_rng: random.Random, rng: random.Random):
    choice = _vr_choices(a, kind_rng)[index]
    if choice is None:
        what = "variable" if index == 0 else "method or second variable"
        return NotApplicable("VR", index, a.language, f"no {what} the prompt defines can be renamed safely "
                             "(the rest are the entry point, named by the tests, imported, builtins, "
                             "attributes or keyword arguments)")
    form, old = choice
    new = a.fresh(old, rng, set())
    lang = _lang(a.language)
    code = a.gen_prompt + a.following
    edits = lang.rename_edits(code, {old: new})
    cut = len(a.gen_prompt)
    prompt = apply_edits(a.gen_prompt, [e for e in edits if e[1] <= cut]) + a.tail
    following = apply_edits(code, [e for e in edits if e[0] >= cut])[cut:]
    if not any(e[1] <= cut for e in edits):
        return NotApplicable("VR", index, a.language, f"{form}: {old!r} has no occurrence to rename in the prompt")
    if not a.checks(prompt, following):
        return NotApplicable("VR", index, a.language, f"{form}: renaming {old!r} does not parse")
    return Variant("VR", index, form, a.language, prompt, rename=((old, new),), detail=f"{old} -> {new}")


def _idp(a: Analysis, d, index: int, kind_rng: random.Random, rng: random.Random):
    form = FORMS["IDP"][index]
    if form == "body-start":
        funcs = [f for f in a.functions if f.site is not None]
        if not funcs:
            return NotApplicable("IDP", index, a.language, "body-start: the prompt has no function body to print in")
        open_ = [f for f in funcs if f.open]
        func = open_[-1] if open_ else rng.choice(funcs)  # the body the completion continues
        return _insert_somewhere(a, "IDP", index, form, rng, [func.site],
                                 lambda: d.print_text(f"DEBUG: {func.name} called"))
    if not a.decls:
        return NotApplicable("IDP", index, a.language, "after-declaration: the prompt declares no variable")
    decl = rng.choice(a.decls)
    return _insert_somewhere(a, "IDP", index, form, rng, [decl.site], lambda: d.print_var(decl.name))


def _idl(a: Analysis, d, index: int, kind_rng: random.Random, rng: random.Random):
    form = FORMS["IDL"][index]
    reserved: set[str] = set()
    var = a.fresh("i", rng, reserved)
    body_kind = rng.choice(("print", "pass", "assign"))
    if body_kind == "print":
        body = d.print_text("unreachable")
    elif body_kind == "pass":
        body = d.noop()
    else:
        value, type_ = d.constant(rng)
        body = d.declare(a.fresh(rng.choice(_NAMES), rng, reserved), value, type_)
    return _insert_somewhere(a, "IDL", index, form, rng, range(len(a.sites)), lambda: d.loop(form, var, body))


_KIND_FUNCS = {"IDC": _idc, "IRV": _irv, "VR": _vr, "IDP": _idp, "IDL": _idl}
