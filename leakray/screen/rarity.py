"""How common a shingle is in code at large, judged from its tokens: punctuation, numbers,
keywords, common builtins and one-letter names occur in almost every file, so shingles made of
them are weak evidence that a text copies a sample.

A shingle is *rare* when at least one of its tokens is not common (an identifier of the
task's own, a string, an unusual call). A pair is reported only when the corpus text shares
enough of the sample's rare shingles, and only rare shingles are indexed for candidates, so
a large file full of ``) ,``, ``= None`` and ``[ 0`` is never even a candidate.
"""

from __future__ import annotations

import keyword

import numpy as np

from leakray.screen.shingle import VALUE_BITS, fold, token_sequence

COMMON_WORDS = frozenset(keyword.kwlist + keyword.softkwlist + """
self cls args kwargs print len range str int float bool list dict set tuple type object isinstance
return super open sorted sum min max abs map zip enumerate append extend get items keys values join
split strip format assert
the a an of to in and or is are be for that with as on by it this from not if at
public private protected static final void class new this null int long double boolean String char
byte short extends implements import package return throws throw try catch finally interface var let
const function undefined true false typeof instanceof struct include define ifdef endif main std
""".split())
_DROP = np.uint64(64 - VALUE_BITS)


def _common_token_hashes() -> np.ndarray:
    words = sorted(COMMON_WORDS)
    punct = [chr(c) for c in range(33, 127) if not chr(c).isalnum() and chr(c) not in "_\\"]
    text = " ".join(words + punct + [str(i) for i in range(100)] + [chr(c) for c in range(97, 123)]
                    + [chr(c) for c in range(65, 91)])
    return np.unique(token_sequence(text)[0])


_COMMON = _common_token_hashes()


def common_tokens(token_hashes: np.ndarray) -> np.ndarray:
    """True where a token is common in code (a digit-only run counts as a number)."""
    pos = np.searchsorted(_COMMON, token_hashes).clip(max=len(_COMMON) - 1)
    return _COMMON[pos] == token_hashes


def shingle_commonness(text: str | bytes, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(distinct shingle values, how many of each shingle's tokens are common: 0..ngram), the
    values being those of `shingle_batch` for the same text."""
    th = token_sequence(text)[0]
    if len(th) < ngram:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    common = common_tokens(th).astype(np.int64)
    score = np.convolve(common, np.ones(ngram, dtype=np.int64), mode="valid")
    values = fold(th, ngram) >> _DROP
    order = np.lexsort((score, values))
    values, score = values[order], score[order]
    first = np.ones(len(values), dtype=bool)
    first[1:] = values[1:] != values[:-1]
    return values[first], score[first]
