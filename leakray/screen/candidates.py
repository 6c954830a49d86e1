"""Candidate pairs from a sorted key index: every (corpus text, benchmark entry) sharing enough keys.

One sorted uint64 array holds the indexed keys of every entry and `owner` the entry of each
key, so a probe for a whole batch of corpus texts is one vectorised lookup (`SortedKeys`); a byte
table (`KeyFilter`) first drops most corpus n-grams with one lookup each, before they are
finished into shingle values.

`RunIndex` finds indexed token runs (the evidence of tests with too few rare shingles, such as
tests made of numbers) in the few corpus texts that hold the first shingle of one.
"""

from __future__ import annotations

import numpy as np

from leakray.screen.shingle import VALUE_BITS, fold, run_values

_U64 = np.uint64
COUNT_TABLE_MAX = 1 << 21  # (rows x owners) up to this many: count hits with one bincount, else sort
_SLOT_MIX = _U64(0x9E3779B97F4A7C15)  # multiplicative hashing: the top bits depend on every bit


class KeyFilter:
    """A table (one byte per slot) answering "maybe indexed" for n-grams read before their last
    mixing step (`shingle.fold_open`, a bijection of the n-gram): the slot is the top bits of
    the open value times an odd constant, two passes where the last fmix64 takes eight. An
    n-gram whose shingle value equals a key's is the key's n-gram (but with probability 2^-48,
    a collision that is no copy), so every indexed n-gram passes, and a few others."""

    def __init__(self, open_keys: np.ndarray, slots_per_key: int = 32, min_bits: int = 12, max_bits: int = 24):
        bits = int(np.clip(np.ceil(np.log2(max(1, len(open_keys)) * slots_per_key)), min_bits, max_bits))
        self.shift = _U64(64 - bits)
        self.table = np.zeros(1 << bits, dtype=bool)
        self.table[self._slots(open_keys)] = True

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    def _slots(self, open_values: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            slots = open_values * _SLOT_MIX
        slots >>= self.shift
        return slots.view(np.int64)

    def maybe(self, open_values: np.ndarray) -> np.ndarray:
        """Positions of the open n-grams that may be indexed (all indexed ones, a few others)."""
        return np.flatnonzero(self.table.take(self._slots(open_values)))


class SortedKeys:
    """Sorted 48-bit keys and a table of where each slot of their top bits begins among them, so
    that finding a value is one lookup and a short scan of its slot (most hold one key or none).
    The values the key filter passes come unsorted, in text order, and a binary search of each
    over all keys costs a cache miss per step."""

    def __init__(self, keys: np.ndarray, slots_per_key: int = 1, max_bits: int = 24):
        self.keys = keys
        bits = int(np.clip(np.ceil(np.log2(max(1, len(keys)) * slots_per_key)), 1, max_bits))
        self.shift = _U64(VALUE_BITS - bits)
        self.start = np.searchsorted(keys >> self.shift, np.arange((1 << bits) + 1, dtype=_U64)).astype(np.int32)

    @property
    def nbytes(self) -> int:
        return self.start.nbytes

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, values: np.ndarray) -> np.ndarray:
        """Index of the first key equal to each value, or -1 (48-bit values)."""
        slot = (values >> self.shift).view(np.int64)
        lo, hi = self.start.take(slot).astype(np.int64), self.start.take(slot + 1)
        # step past the smaller keys of the slot, for the values still short of theirs
        todo = np.flatnonzero(lo < hi)
        while len(todo):
            at = lo[todo]
            smaller = self.keys.take(at) < values[todo]
            todo = todo[smaller]
            lo[todo] += 1
            todo = todo[lo[todo] < hi[todo]]
        found = self.keys.take(lo, mode="clip") == values
        return np.where(found, lo, -1)


def _distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of `a`, sorted in place (np.unique hashes first: slower here)."""
    a.sort()
    keep = np.empty(len(a), dtype=bool)
    keep[:1] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def expand_matches(sorted_keys: np.ndarray | SortedKeys, owner: np.ndarray, query: np.ndarray,
                   query_row: np.ndarray, min_hits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each query key, every owner of an equal key: distinct (query_row, owner) pairs and how
    many distinct keys matched each; with `min_hits` (per owner) only pairs matched by that many keys."""
    none = np.empty(0, np.int64)
    if len(query) == 0 or len(sorted_keys) == 0:
        return none, none, none
    table = sorted_keys if isinstance(sorted_keys, SortedKeys) else SortedKeys(sorted_keys)
    sorted_keys = table.keys
    lo = table.find(query)
    hit = lo >= 0
    if not hit.any():
        return none, none, none
    lo, qrow = lo[hit], query_row[hit]
    # a key repeated in one row counts once (the query may hold a text's shingles with repeats)
    once = _distinct(qrow.astype(np.int64) * len(sorted_keys) + lo)
    qrow, lo = np.divmod(once, len(sorted_keys))
    cnt = np.searchsorted(sorted_keys, sorted_keys[lo], side="right") - lo
    total = int(cnt.sum())
    # positions lo[i] .. lo[i]+cnt[i]-1 for every hit, without a Python loop
    run_start = np.repeat(np.cumsum(cnt) - cnt, cnt)
    pos = np.repeat(lo, cnt) + (np.arange(total) - run_start)
    rows = np.repeat(qrow, cnt).astype(np.int64)
    ids = owner[pos].astype(np.int64)
    width = int(owner.max()) + 1
    nrows = int(rows.max()) + 1
    code = rows * width + ids
    if nrows * width <= COUNT_TABLE_MAX:  # a table of counts: no sort of the hits
        table = np.bincount(code, minlength=nrows * width)
        pair = np.flatnonzero(table)
        count = table[pair]
    else:
        pair, count = np.unique(code, return_counts=True)
    if min_hits is not None:
        keep = count >= min_hits[pair % width]
        pair, count = pair[keep], count[keep]
    return pair // width, pair % width, count


class RunIndex:
    """The indexed token runs of a benchmark: their sorted 48-bit values (`keys`), the entry of
    each (`owner`), and the sorted values of their first n-grams (`first`), which are shingles:
    the shingle prefilter finds the few texts holding one, and only those are read for runs."""

    def __init__(self, keys: np.ndarray, owner: np.ndarray, first: np.ndarray, ngram: int, grams: int):
        self.keys, self.owner, self.first, self.ngram, self.grams = keys, owner, first, ngram, grams
        self.span = ngram * grams  # tokens of a run

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.owner.nbytes + self.first.nbytes

    def starts_in(self, values: np.ndarray) -> np.ndarray:
        """Which of these shingle values begin an indexed run."""
        if len(values) == 0:
            return np.zeros(0, dtype=bool)
        return self.first[np.searchsorted(self.first, values).clip(max=len(self.first) - 1)] == values

    def found(self, token_hashes: np.ndarray) -> np.ndarray:
        """The distinct indexed runs in a text (its token hashes in order)."""
        m = len(token_hashes) - self.span + 1
        if m <= 0:
            return np.empty(0, _U64)
        grams = fold(token_hashes, self.ngram)
        p = np.flatnonzero(self.starts_in(grams[:m] >> _U64(64 - VALUE_BITS)))
        v = run_values(grams, p, self.ngram, self.grams)
        return np.unique(v[self.keys[np.searchsorted(self.keys, v).clip(max=len(self.keys) - 1)] == v])
