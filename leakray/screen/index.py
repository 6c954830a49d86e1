"""The benchmark index: every screened text of every benchmark, built once, shared read-only.

It holds only numpy arrays and the config (no texts), so it pickles out-of-band into the
Ray object store and every worker maps the same copy.

- ``sets``: distinct shingle hashes per entry (exact verification),
- ``sigs`` + ``bands``: MinHash signatures and their LSH band keys (Jaccard screening),
- ``prefix_keys`` / ``prefix_owner``: a prefix-filter index for containment screening. An entry
  with n shingles has containment >= t in a file only if the file holds at least need =
  ceil(t*n) of them, i.e. misses at most n - need; so of its ``n - need + k`` rarest shingles
  (rarity = how many entries share a shingle) the file holds at least k. Only those are
  indexed, a file is a candidate when it hits k of them (k = ``prefix_hits``, at most need),
  and candidates are verified exactly. No containment pair above the threshold is missed (the
  filter is exact, unlike banding); k > 1 removes most chance hits on common code.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

import numpy as np

from leakray.screen.lsh import BandIndex, optimal_params
from leakray.screen.minhash import SCHEME, MinHasher, permutations
from leakray.screen.shingle import TOKENIZER_NAME, ShingleSets, shingle_batch

FIELDS = ("reference", "prompt", "both")
EPS = 1e-9


@dataclass(frozen=True)
class ScreenConfig:
    threshold: float = 0.7  # Jaccard, on the hashed shingles
    ngram: int = 2
    num_perm: int = 256
    seed: int = 1
    containment: float = 0.8  # 0 disables containment screening
    min_containment_shingles: int = 16  # shorter samples are too generic to call "contained"
    prefix_hits: int = 3  # containment candidates must hit this many indexed shingles (exact)
    field: str = "reference"  # which text of a sample: reference | prompt | both
    max_file_bytes: int = 2 << 20  # bigger corpus files are skipped as "huge"

    def __post_init__(self):
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")
        if not 0.0 <= self.containment <= 1.0:
            raise ValueError("containment must be in [0, 1] (0 disables it)")
        if self.ngram < 1 or self.num_perm < 1 or self.prefix_hits < 1:
            raise ValueError("ngram and num_perm must be positive")
        if self.field not in FIELDS:
            raise ValueError(f"field must be one of {FIELDS}")

    @property
    def lsh_params(self) -> tuple[int, int]:
        return optimal_params(self.threshold, self.num_perm)

    def record(self) -> dict:
        bands, rows = self.lsh_params
        a, b = permutations(self.num_perm, self.seed)
        return {**asdict(self), "bands": bands, "rows": rows, "minhash_scheme": SCHEME,
                "permutations_sha256": hashlib.sha256(a.tobytes() + b.tobytes()).hexdigest(),
                "permutations": "datasketch affine32: numpy RandomState(seed), a odd, b uniform uint32",
                "tokenizer": TOKENIZER_NAME, "shingle_hash": "token: 2x8-byte words (<=16 B) or poly mod 2^64, n-gram fold, murmur3 fmix64"}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.record(), sort_keys=True).encode()).hexdigest()[:16]


def required_shared(n: int | np.ndarray, t: float):
    """Shingles a file must share with an entry of n shingles for containment >= t."""
    return np.maximum(np.ceil(np.asarray(n) * t - EPS).astype(np.int64), 1)


def prefix_length(n: int | np.ndarray, t: float, hits: int = 1):
    """How many of an entry's rarest shingles to index so that a file with containment >= t
    holds at least min(hits, required) of them."""
    need = required_shared(n, t)
    return np.asarray(n) - need + np.minimum(hits, need)


class BenchmarkIndex:
    def __init__(self, config: ScreenConfig, texts: list[str]):
        self.config = config
        self.n = len(texts)
        self.hasher = MinHasher(config.num_perm, config.seed)
        self.sets: ShingleSets = shingle_batch(texts, config.ngram)
        sizes = self.sets.sizes
        self.sizes = sizes
        self.screenable = sizes > 0
        self.sigs = self.hasher.signatures(self.sets)
        bands, rows = config.lsh_params
        ok = np.flatnonzero(self.screenable)
        self.bands = BandIndex(self.sigs[ok], bands, rows, ids=ok)
        t = config.threshold
        self.jaccard_size_range = ((t * sizes[ok].min() - EPS, sizes[ok].max() / t + EPS) if len(ok)
                                   else (math.inf, -math.inf))
        self.contain_ok = (sizes >= max(1, config.min_containment_shingles)) & (config.containment > 0)
        self._build_prefix()

    def _build_prefix(self) -> None:
        tc = self.config.containment
        rows = np.flatnonzero(self.contain_ok)
        if len(rows) == 0:
            self.prefix_keys, self.prefix_owner = np.empty(0, np.uint64), np.empty(0, np.int32)
            self.prefix_need = np.zeros(self.n, dtype=np.int32)
            self.contain_min_size = math.inf
            return
        sizes = self.sizes[rows]
        values = np.concatenate([self.sets[r] for r in rows])
        owner = np.repeat(rows, sizes)
        _, inv, counts = np.unique(values, return_inverse=True, return_counts=True)
        df = counts[inv]
        order = np.lexsort((values, df, owner))  # per entry: rarest first, ties by hash
        values, owner = values[order], owner[order]
        seg_start = np.repeat(np.cumsum(sizes) - sizes, sizes)
        rank = np.arange(len(values)) - seg_start
        keep = rank < np.repeat(prefix_length(sizes, tc, self.config.prefix_hits), sizes)
        keys, owner = values[keep], owner[keep].astype(np.int32)
        order = np.argsort(keys, kind="stable")
        self.prefix_keys, self.prefix_owner = keys[order], owner[order]
        self.contain_min_size = float(np.ceil(tc * sizes.min() - EPS))
        # hits a candidate needs, per entry (0 where containment is off)
        self.prefix_need = np.zeros(self.n, dtype=np.int32)
        self.prefix_need[rows] = np.minimum(self.config.prefix_hits, required_shared(sizes, tc))

    @property
    def nbytes(self) -> int:
        return (self.sets.values.nbytes + self.sets.offsets.nbytes + self.sigs.nbytes + self.bands.nbytes
                + self.prefix_keys.nbytes + self.prefix_owner.nbytes + self.prefix_need.nbytes + self.sizes.nbytes
                + self.contain_ok.nbytes + self.screenable.nbytes)
