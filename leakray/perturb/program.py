"""What a perturbation needs to know about a prompt, whatever its language.

A language module (``python_code``, ``java_code``) reads the prompt -- together with the
reference continuation when it is known, so that insertions are checked against the code
that follows them -- and returns an ``Analysis``: where a statement may be inserted
(``Site``), which variables are certainly bound there (``Decl``), which statements may be
copied into a dead branch (``Copyable``), and which identifiers may be renamed. The
perturbation kinds (``kinds``) work on this alone and never look at syntax themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

_WORD = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


@dataclass(frozen=True)
class Site:
    """A place between two statements of one body, in the generation prompt."""

    line: int  # insert after this many lines of the generation prompt
    indent: str  # the body's indentation
    scope: int  # which body (index into Analysis.bodies); statements copied stay in their body
    start: bool  # the first place of a function body (after its docstring / its '{')


@dataclass(frozen=True)
class Decl:
    """A variable certainly bound right after ``site``: a parameter or a simple declaration."""

    name: str
    site: int  # index into Analysis.sites: the place just after the declaring line
    type: str = ""  # its declared type (Java), "" where the language has none


@dataclass(frozen=True)
class Copyable:
    """A one-line statement that may be repeated, dead, at ``sites`` (later places in its body)."""

    text: str
    sites: tuple[int, ...]


@dataclass(frozen=True)
class Function:
    name: str
    site: int | None  # its start site, None when its body starts outside the prompt
    open: bool  # the completion continues this function's body


@dataclass
class Analysis:
    language: str
    gen_prompt: str  # the prompt without trailing whitespace, as a model is given it
    tail: str  # the prompt's trailing whitespace, kept in every variant
    following: str  # what follows gen_prompt when checking: the reference continuation or a probe
    unit: str  # one level of indentation in this prompt
    sites: list[Site] = field(default_factory=list)
    decls: list[Decl] = field(default_factory=list)
    copyables: list[Copyable] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)
    renamable: dict[str, str] = field(default_factory=dict)  # name -> "variable" | "method"
    taken: set[str] = field(default_factory=set)  # every word of prompt, reference and tests
    parses: Callable[[str], bool] | None = None  # does this program text still parse?

    @property
    def prompt_lines(self) -> int:
        """Lines of the generation prompt; a site past them would insert into the continuation."""
        return self.gen_prompt.count("\n") + 1

    @property
    def end_ok(self) -> bool:
        """Whether a statement may go after the prompt's last line: only when the continuation
        starts a new line (or is empty)."""
        return self.following.lstrip(" \t").startswith("\n") or not self.following.strip()

    def insert(self, site: Site, lines: list[str]) -> str:
        """The prompt with ``lines`` (relative indentation in ``unit`` steps already applied)
        inserted at ``site``, at the body's indentation."""
        rows = self.gen_prompt.split("\n")
        new = [site.indent + line if line else line for line in lines]
        return "\n".join(rows[:site.line] + new + rows[site.line:]) + self.tail

    def checks(self, variant_prompt: str, following: str | None = None) -> bool:
        """True when the variant prompt followed by the continuation still parses."""
        from leakray.data.tasks import generation_prompt

        text = generation_prompt(variant_prompt) + (self.following if following is None else following)
        return self.parses is None or self.parses(text)

    def fresh(self, base: str, rng, reserved: set[str]) -> str:
        """A name built on ``base`` that occurs nowhere in prompt, reference or tests."""
        for _ in range(1000):
            name = f"{base}{rng.randint(1, 99)}" if not base[-1:].isdigit() else f"{base}_{rng.randint(1, 99)}"
            if name not in self.taken and name not in reserved:
                reserved.add(name)
                return name
        raise RuntimeError(f"no fresh name on {base!r}")  # unreachable with finite prompts


def new_analysis(language: str, prompt: str, following: str | None, probe: Callable[[str], str | None],
                 parses: Callable[[str], bool]) -> Analysis | None:
    """An Analysis of ``prompt`` with nothing found yet: its generation prompt, the trailing
    whitespace every variant keeps, and what follows when checking -- the reference
    continuation, or without one ``probe(generation prompt)``; None when the probe finds none."""
    from leakray.data.tasks import generation_prompt

    gp = generation_prompt(prompt)
    if following is None:
        following = probe(gp)
        if following is None:
            return None
    return Analysis(language, gp, prompt[len(gp):], following, unit="    ", parses=parses)


def words(*texts: str | None) -> set[str]:
    """Every identifier-like word in the texts, strings and comments included (conservative)."""
    out: set[str] = set()
    for text in texts:
        if text:
            out.update(_WORD.findall(text))
    return out


def leading_ws(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def indent_unit(sample_indents: list[tuple[str, str]]) -> str:
    """One indentation step, from (outer, inner) pairs of a header and its body; 4 spaces by default."""
    for outer, inner in sample_indents:
        if inner.startswith(outer) and len(inner) > len(outer):
            return inner[len(outer):]
    return "    "
