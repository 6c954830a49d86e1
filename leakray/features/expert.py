"""Per-completion expert features against the reference: CodeBLEU, token edit distance,
and the 4k expert vector CGMIA feeds its frozen projection.

Everything here is plain Python on dict batches (a Ray Data ``map_batches`` fn or a test).
"""

from __future__ import annotations

import logging
import re
import textwrap
from collections import Counter
from typing import Any, Iterable, Mapping

import numpy as np
from rapidfuzz.distance import Levenshtein

from leakray.errors import BadInput
from leakray.schema import LANGUAGES, C

# When a benchmark has no tests the pass block of the expert vector is this constant
# (all k entries). A train-constant column carries no information; the CGMIA detector
# drops such columns before its scaler, so the constant never reaches the model.
NO_TESTS_PASS_VALUE = 0.0

# Reasons a CodeBLEU score was forced to 0.0 (counted, never raised).
CB_EMPTY = "empty_prediction"
CB_ERROR = "codebleu_error"
# Counted only: the prediction has tree-sitter ERROR nodes (often a truncated sample).
# Scored as usual unless ``zero_on_syntax_error`` -- a half-written verbatim copy of
# the reference is exactly the membership signal we want to keep.
CB_SYNTAX = "prediction_syntax_error"

# Reference side: the reference's comparable text does not parse (counted per stage).
REF_SYNTAX = "reference_syntax_error"
PARSE_NOTES = (CB_SYNTAX, REF_SYNTAX)

_CODEBLEU_LANG = {"python": "python", "java": "java"}


def comparable(prompt: str, code: str, language: str, *, reference: bool = False) -> str:
    """The text CodeBLEU, edit distance and the encoder see, built alike for both sides.

    Python: the code after the prompt (a completion, or the reference's continuation),
    dedented, so a function body parses as statements and the shared prompt does not
    dilute the similarity. Java: the whole program (prompt + completion vs the complete
    reference), since a method body alone never parses."""
    from leakray.data.tasks import continuation, program_of

    if language == "java":
        return code if reference else program_of(prompt, code)
    text = continuation(prompt, code) if reference else code
    return textwrap.dedent(text.expandtabs(8)).strip("\n") + "\n"

# Words (identifiers, keywords, numbers) or single non-space characters. Strings and
# comments are split the same way on both sides, so a one-word change in a docstring
# costs one token, not the whole literal.
_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def code_tokens(code: str) -> list[str]:
    """Language-agnostic code tokens (whitespace dropped)."""
    return _TOKEN_RE.findall(code)


def edit_distance(reference: str, prediction: str) -> float:
    """Normalised token-level Levenshtein distance in [0, 1] (0 = identical token streams)."""
    ref_toks, pred_toks = code_tokens(reference), code_tokens(prediction)
    vocab: dict[str, int] = {}
    ref_ids = [vocab.setdefault(t, len(vocab)) for t in ref_toks]
    pred_ids = [vocab.setdefault(t, len(vocab)) for t in pred_toks]
    return float(Levenshtein.normalized_distance(ref_ids, pred_ids))


_parsers: dict[str, Any] = {}


def _parser(lang: str):
    # One tree-sitter parser per language per process, for the syntax-error check only.
    # (calc_codebleu's own Language/Parser construction is ~1 us; profiled, not worth patching.)
    if lang not in _parsers:
        from codebleu.utils import get_tree_sitter_language
        from tree_sitter import Parser

        parser = Parser()
        parser.language = get_tree_sitter_language(lang)
        _parsers[lang] = parser
    return _parsers[lang]


class _DropNoDataflowWarning(logging.Filter):
    """calc_codebleu logs (on the root logger) a WARNING for every reference without
    data-flow edges -- once per call, so millions in a sweep. Drop only that record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "no reference data-flows" not in str(record.msg)


_filter_installed = False


def _install_log_filter() -> None:
    global _filter_installed
    if not _filter_installed:
        logging.getLogger().addFilter(_DropNoDataflowWarning())
        _deterministic_dataflow()
        _filter_installed = True


def _deterministic_dataflow() -> None:
    """codebleu 0.7's data-flow match merges each variable's parents through `list(set(...))`
    and then numbers variables in list order, so the same pair scored differently in processes
    with different string-hash seeds (measured: 0.148 / 0.164 / 0.179 for one completion under
    PYTHONHASHSEED 2 / 0 / 3), and a card's CGMIA scores changed between two audits of one
    target. Sorting each parent list before numbering gives one canonical answer."""
    import codebleu.dataflow_match as dm

    if getattr(dm.normalize_dataflow, "_leakray_sorted", False):
        return
    original = dm.normalize_dataflow

    def normalize_dataflow(dataflow):
        return original([(d[0], d[1], d[2], sorted(d[3]), *d[4:]) for d in dataflow])

    normalize_dataflow._leakray_sorted = True
    dm.normalize_dataflow = normalize_dataflow


def codebleu(reference: str, prediction: str, language: str, *,
             reasons: Counter | None = None, zero_on_syntax_error: bool = False) -> float:
    """CodeBLEU (codebleu package, default weights) of one prediction against one reference.

    Returns 0.0 instead of raising when the prediction is empty (the package would
    score it 0.25 through its ``dataflow or 1`` fallback) or the package fails; each
    such case increments ``reasons[...]``.
    """
    from codebleu import calc_codebleu

    lang = _CODEBLEU_LANG.get(language)
    if lang is None:
        raise BadInput(f"CodeBLEU language must be one of {sorted(_CODEBLEU_LANG)}, got {language!r}",
                       field=C.LANGUAGE)
    reasons = reasons if reasons is not None else Counter()
    if not prediction or not prediction.strip():
        reasons[CB_EMPTY] += 1
        return 0.0
    try:
        if _parser(lang).parse(prediction.encode("utf8")).root_node.has_error:
            reasons[CB_SYNTAX] += 1
            if zero_on_syntax_error:
                return 0.0
        _install_log_filter()
        score = float(calc_codebleu([reference], [prediction], lang=lang)["codebleu"])
    except Exception:  # noqa: BLE001 -- the package has many failure modes; count, don't crash
        reasons[CB_ERROR] += 1
        return 0.0
    if not np.isfinite(score):
        reasons[CB_ERROR] += 1
        return 0.0
    return score


def _rows(column: Any) -> list:
    """A batch column as a list of per-row values (lists, numpy object arrays or 2-D arrays)."""
    if hasattr(column, "to_pylist"):
        return column.to_pylist()
    return list(column)


def _require(batch: Mapping[str, Any], names: Iterable[str]) -> None:
    missing = [n for n in names if n not in batch]
    if missing:
        raise BadInput(f"batch lacks columns {missing}", field=missing[0])


def score_batch(batch: Mapping[str, Any], *, zero_on_syntax_error: bool = False,
                stats: Counter | None = None, row_stats: list[Counter] | None = None) -> dict[str, Any]:
    """Add C.CODEBLEU, C.EDIT_DISTANCE (k floats each) and C.EXPERT (4k floats) to a batch.

    Reads C.REFERENCE, C.LANGUAGE, C.COMPLETIONS (k *program* texts: prompt + completion),
    C.PERPLEXITY, C.PASSED, C.HAS_TESTS. The expert vector is laid out in C.EXPERT_BLOCKS
    order: perplexity*k, codebleu*k, edit*k, pass*k (pass as 0/1; NO_TESTS_PASS_VALUE
    when the task has no tests). New columns are lists of 1-D float32 arrays, one per row,
    which ``pa.array(..., pa.list_(pa.float32()))`` takes as-is.
    ``stats`` (if given) accumulates rows and CodeBLEU zeroing reasons for the stage report;
    ``row_stats`` (one Counter per row, if given) gets the same reasons per row, plus
    REF_SYNTAX when the reference itself does not parse.
    """
    if hasattr(batch, "to_pydict"):  # a pyarrow Table
        batch = batch.to_pydict()
    _require(batch, (C.REFERENCE, C.LANGUAGE, C.COMPLETIONS, C.PERPLEXITY, C.PASSED, C.HAS_TESTS))
    refs, langs = _rows(batch[C.REFERENCE]), _rows(batch[C.LANGUAGE])
    comps, ppls = _rows(batch[C.COMPLETIONS]), _rows(batch[C.PERPLEXITY])
    passed, has_tests = _rows(batch[C.PASSED]), _rows(batch[C.HAS_TESTS])
    n = len(refs)
    for name, col in ((C.LANGUAGE, langs), (C.COMPLETIONS, comps), (C.PERPLEXITY, ppls),
                      (C.PASSED, passed), (C.HAS_TESTS, has_tests)):
        if len(col) != n:
            raise BadInput(f"column has {len(col)} rows, {C.REFERENCE} has {n}", field=name)

    stats = stats if stats is not None else Counter()
    k = None
    out_cb, out_ed, out_ex = [], [], []
    for i in range(n):
        lang, ref = langs[i], refs[i]
        if lang not in LANGUAGES:
            raise BadInput(f"unknown language {lang!r}", row=i, field=C.LANGUAGE)
        if not isinstance(ref, str) or not ref.strip():
            raise BadInput("empty reference", row=i, field=C.REFERENCE)
        progs = list(comps[i]) if comps[i] is not None else []
        if k is None:
            k = len(progs)
            if k == 0:
                raise BadInput("no completions", row=i, field=C.COMPLETIONS)
        for name, val in ((C.COMPLETIONS, progs), (C.PERPLEXITY, ppls[i]), (C.PASSED, passed[i])):
            if val is None or len(val) != k:
                raise BadInput(f"expected {k} entries (k from row 0), got "
                               f"{None if val is None else len(val)}", row=i, field=name)
        ppl = np.asarray(ppls[i], dtype=np.float64)
        if not np.all(np.isfinite(ppl)):
            raise BadInput(f"non-finite perplexity {ppl.tolist()}", row=i, field=C.PERPLEXITY)
        if has_tests[i] is None:
            raise BadInput("missing", row=i, field=C.HAS_TESTS)
        reasons = row_stats[i] if row_stats is not None else Counter()
        if _parser(lang).parse(ref.encode("utf8")).root_node.has_error:
            reasons[REF_SYNTAX] += 1
        cb = np.array([codebleu(ref, p or "", lang, reasons=reasons,
                                zero_on_syntax_error=zero_on_syntax_error) for p in progs])
        stats.update(reasons)
        ed = np.array([edit_distance(ref, p or "") for p in progs])
        if bool(has_tests[i]):
            if any(v is None for v in passed[i]):
                raise BadInput("null pass flag", row=i, field=C.PASSED)
            ps = np.array([1.0 if bool(v) else 0.0 for v in passed[i]])
        else:
            ps = np.full(k, NO_TESTS_PASS_VALUE)
        out_cb.append(cb.astype(np.float32))
        out_ed.append(ed.astype(np.float32))
        out_ex.append(np.concatenate([ppl, cb, ed, ps]).astype(np.float32))
        stats["rows"] += 1

    out = dict(batch)
    out[C.CODEBLEU], out[C.EDIT_DISTANCE], out[C.EXPERT] = out_cb, out_ed, out_ex
    return out
