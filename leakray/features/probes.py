"""Text-only memory probes: what the model writes when handed part of a reference solution.

Five probes, each a few greedy continuations or one-token draws per task and nothing but text
back, so they work on an endpoint that returns no log-probabilities:

- **prefix** (n-gram accuracy, Xu et al. 2024): the prompt plus the reference continuation up to a
  cut point (at 1/4, 1/2 and 3/4 of its characters, moved to the nearest start of a word so no
  token is split); the model's continuation is compared with the true rest: the first
  ``NGRAM`` code tokens exactly, the longest common prefix, and the edit similarity over the
  first ``WINDOW`` code tokens.
- **mask** (TS-Guessing, Deng et al. 2024, for a completion-only model): the reference is cut
  right before a distinctive span (the solution's longest identifiers that the prompt does not
  contain; a line when it has none), and the continuation's first identifier (or line) is
  compared with the hidden span. A base LM cannot fill a blank mid-text, but the text before
  the blank is exactly what a fill-in prompt would show it.
- **greedy / rewrite preference** (in the spirit of the Data Contamination Quiz): the greedy
  completion of the prompt, compared with the reference continuation and with rewrites of it
  that rename the solution's locals (``leakray.perturb.rewrite``): a model that read the
  original lands nearer it than its equally natural rewrites.
- **next** (sampled next-token agreement): the program is cut at up to ``NEXT_CUTS`` token starts
  of the reference continuation, and the model writes ``NEXT_DRAWS`` one-token continuations of
  each cut at temperature 1; a draw agrees when the true rest starts with it. The share of
  agreeing draws estimates the probability the model gives the reference's next token, so the
  probe reads a likelihood through text alone: greedy decoding (the three probes above) keeps
  only the top token, which a small or lightly exposed model rarely gets right even for a
  member, while the frequency of the true token moves with every exposure. Against a local
  reference model's draws at the same cuts it is calibrated for how predictable the code is.
- **question** (the same draws, over the question): cuts at up to ``NEXT_CUTS`` token starts of
  the prompt itself (signature, docstring, examples), given only the prompt's text before each.
  Xu et al. score n-gram accuracy over question and answer; a model that read a benchmark's
  sample read its question too, and a prompt holds more tokens than its solution (HumanEval:
  about 150 against 60). Its draws are at other positions than ``next``'s, so the two estimate
  the exposure with independent noise: on the audit matrix's dose-16 target, exact
  probabilities with 128 draws simulated at 64 cuts read AUC 0.85 over the question, 0.84 over
  the solution and 0.91 for the two averaged (exact, no draws: 0.955 and 0.927).

Everything a detector needs is rebuilt from the collection (the prompt, the reference, the cut
offsets, the spans), so probe construction and scoring live here, in one place for the stage
that samples and the detectors that score.
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
from collections import Counter

from rapidfuzz.distance import Levenshtein

from leakray.data.tasks import continuation, generation_prompt
from leakray.features.expert import code_tokens

PROBES = ("prefix", "mask", "greedy", "next", "question")
PREFIX_FRACTIONS = (0.25, 0.5, 0.75)
N_MASKS = 3
N_REWRITES = 4
NGRAM = 5  # Xu et al. score the next 5-gram
WINDOW = 32  # code tokens of the continuation compared (the probe's generation budget covers them)
NEXT_CUTS = 64  # cut points of the next-token probe, spread evenly over the continuation's tokens
# one-token continuations drawn at each cut: simulated on the dose-16 target, calibrated AUC 0.75
# at 16 draws, 0.82 at 32, 0.88 at 128 (benchmarks/sim_next_token_draws.py); measured on the
# dose-16 sweep, 0.780 at 32 and 0.886 at 128 (docs/LEAK.md). The draws come from one forward pass
# per cut (local and vLLM samplers) or one request of n draws and one token (an endpoint; OpenAI's
# API caps n at 128), so 128 costs what 32 did but the sampled tokens. More read fainter leaks
# (512: +0.03 AUC at dose 4, simulated; docs/LEAK.md, "What the draws can read"), and through an
# endpoint cost a request per `sample.max_n` more.
NEXT_DRAWS = 128
_IDENT = re.compile(r"[A-Za-z_]\w*")
# where a byte-level BPE tokenizer (GPT-2's pre-tokenizer, which code LLMs' tokenizers share) may
# start a token: a cut there leaves the given text's tokens those of the whole program's head
_PRETOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
_WORD_START = re.compile(r"(?<=\s)\S")
_JAVA_WORDS = {"public", "private", "protected", "static", "final", "class", "new", "return", "int", "long",
               "double", "float", "boolean", "char", "void", "String", "true", "false", "null", "this", "for",
               "while", "if", "else", "List", "ArrayList", "Map", "HashMap", "import", "java", "util"}
_COMMON = frozenset(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist) | _JAVA_WORDS


def given_and_target(prompt: str, reference: str, cut: int) -> tuple[str, str]:
    """(what the model is given, the true text after it) for a probe that ends at character
    ``cut`` of the reference continuation. The given text ends at its last visible character,
    as every generation prompt does, so the target starts with the whitespace the model must
    write itself."""
    program = generation_prompt(prompt) + continuation(prompt, reference)
    given = program[: len(generation_prompt(prompt)) + cut].rstrip()
    return given, program[len(given):]


def prefix_cuts(prompt: str, reference: str, fractions=PREFIX_FRACTIONS) -> list[int]:
    """Cut offsets into the continuation: the word start nearest each fraction of its length,
    after at least one visible character of it (a cut before any is the greedy probe's);
    [0] when the continuation is a single word."""
    cont = continuation(prompt, reference)
    starts = [m.start() for m in _WORD_START.finditer(cont) if cont[: m.start()].strip()]
    if not starts:
        return [0]
    n = len(cont.rstrip())
    return sorted({min(starts, key=lambda s: abs(s - f * n)) for f in fractions})


def next_cuts(prompt: str, reference: str, n: int = NEXT_CUTS) -> list[int]:
    """Cut offsets into the continuation for the next-token probe: token starts (``_PRETOKEN``),
    0 among them, at most ``n`` spread evenly over the continuation."""
    cont = continuation(prompt, reference).rstrip()
    starts = [m.start() for m in _PRETOKEN.finditer(cont)]
    if len(starts) > n:
        starts = [starts[round(i * (len(starts) - 1) / (n - 1))] for i in range(n)] if n > 1 else starts[:1]
    return sorted(set(starts))


def next_given_and_target(prompt: str, reference: str, cut: int) -> tuple[str, str]:
    """(the given text, the true rest) of a next-token cut: the program split at the cut exactly,
    whitespace included (the next token of code is often whitespace the model must write)."""
    program = generation_prompt(prompt) + continuation(prompt, reference)
    at = len(generation_prompt(prompt)) + cut
    return program[:at], program[at:]


def question_cuts(prompt: str, reference: str = "", n: int = NEXT_CUTS) -> list[int]:
    """Cut offsets into the generation prompt for the question probe: its token starts after its
    first visible character (an empty given text is no request), at most ``n`` spread evenly.
    ``reference`` is unused: the signature is ``next_cuts``' so both probes are read alike."""
    head = generation_prompt(prompt)
    starts = [m.start() for m in _PRETOKEN.finditer(head) if head[: m.start()].strip()]
    if len(starts) > n:
        starts = [starts[round(i * (len(starts) - 1) / (n - 1))] for i in range(n)] if n > 1 else starts[:1]
    return sorted(set(starts))


def question_given_and_target(prompt: str, reference: str, cut: int) -> tuple[str, str]:
    """(the given text, the true rest) of a question cut: the program split at offset ``cut`` of
    the prompt; the rest runs on into the solution, as the text the model read did."""
    program = generation_prompt(prompt) + continuation(prompt, reference)
    return program[:cut], program[cut:]


# the sampled probes: probe -> (cuts of a task, the given text and true rest at a cut)
DRAW_PROBES = {"next": (next_cuts, next_given_and_target), "question": (question_cuts, question_given_and_target)}


def mask_spans(prompt: str, reference: str, n: int = N_MASKS) -> list[tuple[int, str]]:
    """(offset in the continuation, span) of up to ``n`` distinctive spans, in text order: the
    first occurrence of the longest identifiers the continuation introduces (not in the prompt,
    not a keyword or builtin, two characters at least); the longest lines when there are none."""
    cont = continuation(prompt, reference)
    seen_in_prompt = set(_IDENT.findall(prompt))
    first: dict[str, int] = {}
    for m in _IDENT.finditer(cont):
        name = m.group()
        if len(name) >= 2 and name not in _COMMON and name not in seen_in_prompt and name not in first:
            first[name] = m.start()
    if first:
        chosen = sorted(first, key=lambda s: (-len(s), first[s]))[:n]
        return sorted((first[s], s) for s in chosen)
    lines, at = [], 0
    for line in cont.splitlines(keepends=True):
        body = line.strip()
        if body:
            lines.append((at + len(line) - len(line.lstrip()), body))
        at += len(line)
    return sorted(sorted(lines, key=lambda x: (-len(x[1]), x[0]))[:n])


def rewrite_continuations(prompt: str, reference: str, tests: str, key: str, n: int = N_REWRITES,
                          seed: int = 0) -> list[str]:
    """Continuations of up to ``n`` rewrites renaming the solution's locals; [] when none can be
    made (no renamable local, not Python): the only rewrite is then the original itself."""
    from leakray.perturb.rewrite import solution_rewrites

    got = solution_rewrites(prompt, reference, tests, n=n, seed=seed, key=key)
    if isinstance(got, str):
        return []
    head = len(generation_prompt(prompt))
    return [program[head:] for program in got]


# -- scores ---------------------------------------------------------------------------------------


def _ids(a: list[str], b: list[str]) -> tuple[list[int], list[int]]:
    vocab: dict[str, int] = {}
    return [vocab.setdefault(t, len(vocab)) for t in a], [vocab.setdefault(t, len(vocab)) for t in b]


def similarity(a: str, b: str) -> float:
    """1 - normalised token edit distance (code tokens, whitespace dropped)."""
    x, y = _ids(code_tokens(a), code_tokens(b))
    return 1.0 - float(Levenshtein.normalized_distance(x, y))


def prefix_match(completion: str, target: str) -> tuple[float, float, float]:
    """(exact next n-gram, longest common prefix share, edit similarity) of a continuation
    against the true one, over their first ``WINDOW`` code tokens."""
    got, want = code_tokens(completion)[:WINDOW], code_tokens(target)[:WINDOW]
    if not want:
        return 1.0, 1.0, 1.0
    n = min(NGRAM, len(want))
    lcp = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    x, y = _ids(got, want)
    return float(got[:n] == want[:n]), lcp / len(want), 1.0 - float(Levenshtein.normalized_distance(x, y))


def mask_match(completion: str, span: str) -> float:
    """How much of a hidden span the continuation restores, in [0, 1]: for an identifier, its
    common prefix with the first identifier written over the longer of the two (1 = the exact
    name); for a line, the edit similarity of the first line written."""
    guess = completion.lstrip()
    if _IDENT.fullmatch(span):
        m = _IDENT.match(guess)
        if not m:
            return 0.0
        word = m.group()
        common = next((i for i, (a, b) in enumerate(zip(word, span)) if a != b), min(len(word), len(span)))
        return common / max(len(word), len(span))
    return similarity(span, guess.split("\n", 1)[0])


def next_agreement(draws: list[str], target: str) -> int:
    """How many draws write the true rest's next pre-token whole: the rest starts with the draw,
    and the draw covers the rest's first pre-token (``_PRETOKEN``, GPT-2's boundaries, where the
    cuts fall). A shorter draw (one space of an indentation, a word's first letter) starts many
    continuations, member or not, and counting it added noise: on three dose sweeps' collections
    (docs/LEAK.md, "Which draws agree") 20 of 24 calibrated readings gained, the solution probe
    against tiny-alt at dose 4 0.599 -> 0.620 on average. A word the model's vocabulary splits
    then agrees under no model, and the calibrated probes read nothing there. An empty draw (an end
    of text) never agrees. Each distinct draw is tested once: on the demo's collections a cut's
    128 draws hold about 14 distinct strings."""
    need = len(next_pretoken(target))
    if not need:  # an empty rest: nothing to agree with
        return 0
    return sum(n for d, n in Counter(draws).items() if len(d) >= need and target.startswith(d))


def next_pretoken(text: str) -> str:
    """The first pre-token of ``text`` (GPT-2's boundaries, ``_PRETOKEN``): a word or number with
    the space before it, a run of symbols, or an indentation but its last space; "" for ""."""
    head = _PRETOKEN.match(text)
    return head.group(0) if head else ""


def next_log_share(hits: int, n: int) -> float:
    """log of the agreeing share, smoothed (a cut where no draw agrees is not -inf): the log keeps
    rare tokens' evidence, as a mean log-likelihood does."""
    return math.log((hits + 0.5) / (n + 1.0))


def rewrite_preference(completion: str, original: str, rewrites: list[str]) -> tuple[float, float]:
    """(similarity to the original continuation, that minus the mean similarity to its
    rewrites); the preference is 0 without rewrites (the original is its only rewrite)."""
    orig = similarity(original, completion)
    if not rewrites:
        return orig, 0.0
    return orig, orig - sum(similarity(r, completion) for r in rewrites) / len(rewrites)
