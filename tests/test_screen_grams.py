"""The corpus pass's n-grams (`TextGrams`) agree with `shingle_batch`: the same values, the same
distinct sets, exact distinct counts up to a limit, and the key filter's picks per text."""

from __future__ import annotations

import random

import numpy as np
import pytest

from leakray.screen.candidates import expand_matches
from leakray.screen.shingle import TextGrams, shingle_batch

TEXTS = ["", "a", "a b", "a a a a a a a a a a a a", "x y " * 100, "(" * 70, "ab ab", "\\n\\n",
         "def f(a, b):\n    return a==b  # café\n", "one two\n" * 3]


def _texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["if", "x", "y", "return", "(", ")", ":", "=", "candidate", "0", "1"]
    out = list(TEXTS)
    for _ in range(30):
        out.append(" ".join(rng.choice(words) + str(rng.randrange(4)) for _ in range(rng.randrange(0, 300))))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("ngram", [1, 2, 3])
@pytest.mark.parametrize("chunk", [1 << 20, 64])
def test_text_grams_match_shingle_batch(ngram, chunk):
    texts = _texts(ngram)
    sets = shingle_batch(texts, ngram)
    grams = TextGrams(texts, ngram, chunk_bytes=chunk)
    assert len(grams) == len(texts)
    rows = np.arange(len(texts))
    got = grams.distinct(rows)
    assert got.sizes.tolist() == sets.sizes.tolist()
    assert np.array_equal(got.values, sets.values)
    for i in rows:
        assert np.array_equal(np.unique(grams.of(i)), sets[i])
    for limit in (0, 1, 2, 5, 40):
        floor = grams.distinct_floor(rows, limit)
        exact = sets.sizes <= limit
        assert np.array_equal(floor[exact], sets.sizes[exact])
        assert (floor[~exact] > limit).all()


def test_selected_grams_are_the_texts_shingles():
    texts = _texts(7)
    sets = shingle_batch(texts, 2)
    grams = TextGrams(texts, 2, chunk_bytes=200)
    values, rows = grams.select(lambda g: np.arange(len(g)))  # every n-gram, crossing ones dropped
    for i in range(len(texts)):
        assert np.array_equal(np.unique(values[rows == i]), sets[i])
    # repeats of a key in one text count once
    keys = np.unique(sets.values)[::3]
    f, e, n = expand_matches(keys, np.arange(len(keys)) % 4, values, rows)
    want = {}
    for i in range(len(texts)):
        for k in np.intersect1d(sets[i], keys):
            j = int(np.searchsorted(keys, k)) % 4
            want[(i, j)] = want.get((i, j), 0) + 1
    assert dict(zip(zip(f.tolist(), e.tolist()), n.tolist())) == want


@pytest.mark.parametrize("r", [1, 2, 3, 8, 9, 16])
def test_window_values_tell_windows_apart(r):
    """Equal values exactly where the r-token windows are equal (the aligned span check)."""
    from leakray.screen.verify import window_values

    rng = np.random.default_rng(r)
    tokens = rng.integers(0, 4, 400).astype(np.uint64)  # few symbols: many repeated windows
    v = window_values(tokens, r)
    windows = [tuple(tokens[i:i + r].tolist()) for i in range(len(tokens) - r + 1)]
    assert len(v) == len(windows)
    by_window = {}
    for w, x in zip(windows, v.tolist()):
        by_window.setdefault(w, set()).add(x)
    assert all(len(x) == 1 for x in by_window.values())
    assert len(set(v.tolist())) == len(by_window)
    assert len(window_values(tokens[:r - 1], r)) == 0
