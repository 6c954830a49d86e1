"""MinHash signatures of many shingle sets at once, bit-compatible with datasketch's "affine32" scheme.

For a shingle hash x (64-bit, from `shingle.py`) the input to MinHash is its low 32 bits h;
permutation k maps h to ``a_k * fmix32(h) + b_k mod 2^32`` (a_k odd, so a bijection), and the
signature is the per-permutation minimum. The (a, b) draws are datasketch's own
(``np.random.RandomState(seed)``), so ``datasketch.MinHash(num_perm, seed, scheme="affine32",
hashfunc=lambda v: v)`` fed the same 32-bit values yields the same hashvalues; tests check this.
The work is one (shingles x num_perm) uint32 block per group of documents, min-reduced per
document with ``np.minimum.reduceat``. Blocks of 512 rows (512 KiB at 256 permutations) stay in
cache: 8192-row blocks (8 MiB) made the signatures of a few large texts 9x slower.
"""

from __future__ import annotations

import numpy as np

from leakray.screen.shingle import ShingleSets

_U32 = np.uint32
EMPTY = np.iinfo(np.uint32).max  # value of an empty signature (datasketch's too)
SCHEME = "affine32"
_F1, _F2 = _U32(0x85EBCA6B), _U32(0xC2B2AE35)


def fmix32(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U32(16))
    h = h * _F1
    h = h ^ (h >> _U32(13))
    h = h * _F2
    return h ^ (h >> _U32(16))


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b), each uint32[num_perm]: datasketch's affine32 draws for this seed."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=_U32) * _U32(2) + _U32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=_U32)
    return a, b


class MinHasher:
    def __init__(self, num_perm: int = 256, seed: int = 1, block_rows: int = 512):
        if num_perm < 1:
            raise ValueError("num_perm must be positive")
        self.num_perm, self.seed, self.block_rows = num_perm, seed, block_rows
        self.a, self.b = permutations(num_perm, seed)

    def inputs(self, values: np.ndarray) -> np.ndarray:
        """64-bit shingle hashes -> the 32-bit values MinHash sees (pre-mixed with fmix32)."""
        return fmix32((values & np.uint64(0xFFFFFFFF)).astype(_U32))

    def signatures(self, sets: ShingleSets, rows: np.ndarray | None = None) -> np.ndarray:
        """uint32[len(rows), num_perm]: signature of each selected document (all by default)."""
        rows = np.arange(len(sets)) if rows is None else np.asarray(rows, dtype=np.int64)
        out = np.full((len(rows), self.num_perm), EMPTY, dtype=_U32)
        offsets, sizes = sets.offsets, sets.sizes
        a, b = self.a, self.b
        i, n = 0, len(rows)
        with np.errstate(over="ignore"):
            while i < n:
                # a group of documents whose shingles fit one block (at least one document)
                total, j = 0, i
                while j < n and (j == i or total + sizes[rows[j]] <= self.block_rows):
                    total += int(sizes[rows[j]])
                    j += 1
                group = rows[i:j]
                gsizes = sizes[group]
                if j - i == 1 and total > self.block_rows:  # one big document: running minimum
                    lo, hi = int(offsets[group[0]]), int(offsets[group[0] + 1])
                    acc = out[i]
                    for s in range(lo, hi, self.block_rows):
                        h = self.inputs(sets.values[s:min(hi, s + self.block_rows)])
                        np.minimum(acc, (h[:, None] * a + b).min(axis=0), out=acc)
                else:
                    nz = gsizes > 0
                    if nz.any():
                        if group[-1] - group[0] == len(group) - 1:  # contiguous rows: one slice
                            base = offsets[group[0]]
                            h = self.inputs(sets.values[base:offsets[group[-1] + 1]])
                            starts = offsets[group[nz]] - base
                        else:
                            idx = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in group[nz]])
                            h = self.inputs(sets.values[idx])
                            starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(gsizes[nz])[:-1]])
                        phv = np.multiply(h[:, None], a)
                        phv += b
                        out[i + np.flatnonzero(nz)] = np.minimum.reduceat(phv, starts, axis=0)
                i = j
        return out


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Fraction of equal signature slots (row-wise when given 2-D arrays)."""
    return np.mean(sig_a == sig_b, axis=-1)
