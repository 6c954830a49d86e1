"""The benchmark index: every screened text of every benchmark, built once, shared read-only.

It holds only numpy arrays and the config (no texts), so it pickles out-of-band into the
Ray object store and every worker maps the same copy.

- ``sets``: distinct shingle hashes per entry (exact verification),
- ``sigs``: MinHash signatures, for the estimate written beside every reported pair,
- ``tokens``: each entry's token hashes in order (aligned-span verification),
- ``keys`` / ``owner`` / ``need``: the candidate index, exact for the reporting rule. A pair
  is reported only if the corpus text shares at least a share t of the entry's r *rare*
  shingles, and at least ``min_rare_shingles`` of them: rare meaning a shingle holding a token
  that is not common in code (`rarity.py`) and that is not boilerplate of the benchmark itself
  (a shingle found in the texts of many of its tasks, like HumanEval's "This prints if this
  assert fails"). That is the rarity-weighted form of Jaccard >= t (which implies
  |e ∩ f| >= t|e|) and of containment >= t. Every rare shingle is indexed, a text is a
  candidate for an entry when it hits need = max(min_rare, ceil(t*r)) of them, and candidates
  are verified exactly: no reportable pair is missed (unlike LSH banding), no corpus text needs
  a MinHash signature unless it is reported, and common code makes no candidates at all.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

import numpy as np

from leakray.screen.candidates import KeyFilter
from leakray.screen.minhash import SCHEME, MinHasher, permutations
from leakray.screen.parts import PARTS
from leakray.screen.rarity import shingle_commonness
from leakray.screen.shingle import TOKENIZER_NAME, VALUE_BITS, ShingleSets, shingle_batch, token_sequence

EPS = 1e-9
BOILERPLATE_MIN_TASKS = 3  # a shingle in the texts of this many tasks ...
BOILERPLATE_SHARE = 0.02  # ... and of this share of them is the benchmark's boilerplate, not evidence


@dataclass(frozen=True)
class ScreenConfig:
    threshold: float = 0.7  # Jaccard, on the hashed shingles
    ngram: int = 2
    num_perm: int = 256
    seed: int = 1
    containment: float = 0.8  # 0 disables containment screening
    parts: tuple[str, ...] = PARTS  # which texts of a sample are screened (any one matching is a leak)
    min_shingles: int = 8  # shorter texts (``return a + b``) are too generic to call a copy of anything
    min_containment_shingles: int = 16  # shorter samples are screened by Jaccard only
    min_rare_shingles: int = 4  # a pair shares at least this many rare shingles (not all common tokens)
    span_tokens: int = 8  # aligned verification: runs of at least this many tokens in the same order ...
    span_coverage: float = 0.5  # ... must cover this share of a sample contained in a corpus text
    max_file_bytes: int = 2 << 20  # bigger corpus texts (and code/text files) are skipped as "huge"
    max_parse_bytes: int = 64 << 20  # bigger whole-file JSON / notebooks are skipped as "huge" (JSONL streams)
    columns: tuple[str, ...] = ()  # parquet/Arrow columns to screen; empty: every text-like string column

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(self.parts))
        object.__setattr__(self, "columns", tuple(self.columns))
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")
        if not 0.0 <= self.containment <= 1.0:
            raise ValueError("containment must be in [0, 1] (0 disables it)")
        if not 0.0 <= self.span_coverage <= 1.0:
            raise ValueError("span coverage must be in [0, 1]")
        if min(self.ngram, self.num_perm, self.min_rare_shingles, self.span_tokens, self.min_shingles) < 1:
            raise ValueError("ngram, num_perm, min_rare_shingles, span_tokens and min_shingles must be positive")
        if not self.parts or set(self.parts) - set(PARTS):
            raise ValueError(f"parts must be some of {PARTS}, got {self.parts}")

    @property
    def min_text_bytes(self) -> int:
        """No corpus text shorter than this can match any entry (each token is at least one byte)."""
        t = min(self.threshold, self.containment or self.threshold)
        return math.ceil(t * self.min_shingles - EPS) + self.ngram - 1

    def record(self) -> dict:
        a, b = permutations(self.num_perm, self.seed)
        return {**asdict(self), "parts": list(self.parts), "columns": list(self.columns),
                "candidates": "every rare shingle indexed, exact (no LSH misses)", "minhash_scheme": SCHEME,
                "permutations_sha256": hashlib.sha256(a.tobytes() + b.tobytes()).hexdigest(),
                "permutations": "datasketch affine32: numpy RandomState(seed), a odd, b uniform uint32",
                "tokenizer": TOKENIZER_NAME,
                "shingle_hash": f"token: first 8-byte word + mixed later words, n-gram fold, murmur3 fmix64, "
                                f"top {VALUE_BITS} bits"}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.record(), sort_keys=True).encode()).hexdigest()[:16]


def required_shared(n: int | np.ndarray, t: float | np.ndarray):
    """Shingles a text must share with an entry of n shingles for containment >= t (or Jaccard >= t)."""
    return np.maximum(np.ceil(np.asarray(n) * np.asarray(t) - EPS).astype(np.int64), 1)


class BenchmarkIndex:
    def __init__(self, config: ScreenConfig, texts: list[str], groups=None):
        """`groups`: the task of each text (parts of one task count once for boilerplate)."""
        self.config = config
        self.n = len(texts)
        self.hasher = MinHasher(config.num_perm, config.seed)
        self.sets: ShingleSets = shingle_batch(texts, config.ngram)
        self.sizes = self.sets.sizes
        self.sigs = self.hasher.signatures(self.sets)
        seqs = [token_sequence(t)[0] for t in texts]
        lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=self.n)
        self.token_values = np.concatenate(seqs) if seqs else np.empty(0, np.uint64)
        self.token_offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lens)])
        self.screenable = self.sizes >= config.min_shingles
        self._build_candidates(texts, groups)
        self.contain_ok = (self.screenable & (self.sizes >= config.min_containment_shingles)
                           & (config.containment > 0))
        self.contain_need = required_shared(self.sizes, config.containment or 1.0)

    def tokens(self, e: int) -> np.ndarray:
        return self.token_values[self.token_offsets[e]:self.token_offsets[e + 1]]

    def _build_candidates(self, texts: list[str], groups) -> None:
        cfg = self.config
        rows = np.flatnonzero(self.screenable)
        values, owner = [], []
        for e in rows:
            v, common = shingle_commonness(texts[e], cfg.ngram)
            if not np.array_equal(v, self.sets[e]):  # the two code paths must agree on every value
                raise AssertionError("shingle values differ between shingle_batch and shingle_commonness")
            values.append(v[common < cfg.ngram])
            owner.append(np.full(len(values[-1]), e, dtype=np.int32))
        keys = np.concatenate(values) if values else np.empty(0, np.uint64)
        owner = np.concatenate(owner) if owner else np.empty(0, np.int32)
        # boilerplate of the benchmark: in the texts of many of its tasks (each task counted once)
        group = np.asarray(groups if groups is not None else np.arange(self.n))[owner]
        task_key = np.unique(np.stack([keys, group.astype(np.uint64)]), axis=1)  # each (shingle, task) once
        uk, df = np.unique(task_key[0], return_counts=True)
        n_groups = len(np.unique(group)) if len(group) else 0
        boiler = uk[df >= max(BOILERPLATE_MIN_TASKS, BOILERPLATE_SHARE * n_groups)]
        keep = ~np.isin(keys, boiler)
        keys, owner = keys[keep], owner[keep]
        rare = np.bincount(owner, minlength=self.n).astype(np.int64)
        self.rare = rare
        self.screenable &= rare >= cfg.min_rare_shingles  # too generic to call anything a copy of it
        contain = (self.sizes >= cfg.min_containment_shingles) & (cfg.containment > 0)
        self.floor = np.where(contain, min(cfg.threshold, cfg.containment or 1.0), cfg.threshold)
        need = np.maximum(required_shared(rare, self.floor), cfg.min_rare_shingles)
        self.need = np.where(self.screenable, need, np.iinfo(np.int32).max).astype(np.int64)
        order = np.argsort(keys, kind="stable")
        self.keys, self.owner = keys[order], owner[order]
        self.keyfilter = KeyFilter(self.keys)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.sets.values, self.sets.offsets, self.sigs, self.token_values,
                                      self.token_offsets, self.keys, self.owner, self.need, self.rare, self.floor,
                                      self.sizes, self.screenable, self.contain_ok, self.contain_need, self.keyfilter.table))
