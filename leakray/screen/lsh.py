"""LSH banding over MinHash signatures, as flat sorted arrays (no dicts, no per-key Python objects).

Bands and rows are datasketch's optimum for the threshold (``MinHashLSH``'s integral of false
positive and false negative probability, equal weights). Each band of r signature values is
folded into one 64-bit key (band number mixed in), so one sorted uint64 array holds every band
of every indexed sample and a probe is one ``np.searchsorted`` for a whole batch of files.
"""

from __future__ import annotations

import functools

import numpy as np

from leakray.screen.shingle import fmix64

_U64 = np.uint64
_BAND_MIX = _U64(0x9E3779B97F4A7C15)
_ROW_MIX = _U64(0xD6E8FEB86659FD93)


@functools.lru_cache(maxsize=64)
def optimal_params(threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) minimising fp_weight * P(false positive) + fn_weight * P(false negative)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError("threshold must be in (0, 1]")
    try:
        from datasketch.lsh import _optimal_param
    except ImportError:  # a datasketch without the (private) helper: the same optimisation in numpy
        return _optimal_param_numpy(threshold, num_perm, fp_weight, fn_weight)
    b, r = _optimal_param(threshold, num_perm, fp_weight, fn_weight)
    return int(b), int(r)


def _optimal_param_numpy(threshold: float, num_perm: int, fp_weight: float, fn_weight: float) -> tuple[int, int]:
    best, opt = float("inf"), (1, 1)
    lo, hi = np.linspace(0.0, threshold, 2001), np.linspace(threshold, 1.0, 2001)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = np.trapezoid(1 - (1 - lo ** r) ** b, lo)
            fn = np.trapezoid((1 - hi ** r) ** b, hi)
            err = fp * fp_weight + fn * fn_weight
            if err < best:
                best, opt = err, (b, r)
    return opt


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """uint64[n, bands]: one key per band of each signature."""
    n = sigs.shape[0]
    s = sigs[:, : bands * rows].reshape(n, bands, rows).astype(_U64)
    with np.errstate(over="ignore"):
        k = np.broadcast_to((np.arange(bands, dtype=_U64) + _U64(1)) * _BAND_MIX, (n, bands)).copy()
        for c in range(rows):
            k = fmix64(k * _ROW_MIX + s[:, :, c])
    return k


class BandIndex:
    """Sorted band keys of indexed signatures and the row (sample) each key belongs to."""

    def __init__(self, sigs: np.ndarray, bands: int, rows: int, ids: np.ndarray | None = None):
        self.bands, self.rows = bands, rows
        ids = np.arange(len(sigs), dtype=np.int32) if ids is None else np.asarray(ids, dtype=np.int32)
        keys = band_keys(sigs, bands, rows).ravel()
        owner = np.repeat(ids, bands)
        order = np.argsort(keys, kind="stable")
        self.keys, self.owner = keys[order], owner[order]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.owner.nbytes

    def probe(self, sigs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (query row, indexed id) pairs that share at least one band."""
        if len(sigs) == 0 or len(self.keys) == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        q = band_keys(sigs, self.bands, self.rows).ravel()
        return expand_matches(self.keys, self.owner, q, np.repeat(np.arange(len(sigs)), self.bands))


def expand_matches(sorted_keys: np.ndarray, owner: np.ndarray, query: np.ndarray, query_row: np.ndarray,
                   min_hits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each query key, every owner of an equal key; distinct (query_row, owner) pairs, and
    with `min_hits` (per owner) only pairs matched by at least that many keys."""
    lo = np.searchsorted(sorted_keys, query, side="left")
    hit = sorted_keys.take(lo, mode="clip") == query
    if not hit.any():
        return np.empty(0, np.int64), np.empty(0, np.int64)
    lo, qrow = lo[hit], query_row[hit]
    cnt = np.searchsorted(sorted_keys, query[hit], side="right") - lo
    total = int(cnt.sum())
    # positions lo[i] .. lo[i]+cnt[i]-1 for every hit, without a Python loop
    run_start = np.repeat(np.cumsum(cnt) - cnt, cnt)
    pos = np.repeat(lo, cnt) + (np.arange(total) - run_start)
    rows = np.repeat(qrow, cnt).astype(np.int64)
    ids = owner[pos].astype(np.int64)
    width = int(owner.max()) + 1
    if min_hits is None:
        pair = np.unique(rows * width + ids)
    else:
        pair, count = np.unique(rows * width + ids, return_counts=True)
        pair = pair[count >= min_hits[pair % width]]
    return pair // width, pair % width
