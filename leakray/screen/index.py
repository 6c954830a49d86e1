"""The benchmark index: every screened text of every benchmark, built once, shared read-only.

It holds only numpy arrays and the config (no texts), so it pickles out-of-band into the
Ray object store and every worker maps the same copy.

- ``sets``: distinct shingle hashes per entry (exact verification),
- ``sigs``: MinHash signatures, for the estimate written beside every reported pair,
- ``tokens``: each entry's token hashes in order (aligned-span verification),
- ``keys`` / ``owner`` / ``need``: the candidate index of *rare* shingles: a shingle holding a
  token that is not common in code (`rarity.py`) and that is not boilerplate of the benchmark
  itself (a shingle found in the texts of many of its tasks, like HumanEval's "This prints if
  this assert fails"). A pair needs at least ``min_rare_shingles`` of the entry's r rare
  shingles; a containment pair also needs a share min(threshold, containment) of them, since a
  large text holds a short sample's common shingles by chance, while renamed identifiers (the
  rare tokens) leave a near-duplicate's Jaccard high. Jaccard >= t implies the text lacks at most
  (1 - t) of the entry's n shingles, so it shares at least r - (1 - t) n rare ones: every rare
  shingle is indexed, a text is a candidate for an entry when it hits that many of them, and
  candidates are verified exactly: no reportable pair is missed (unlike LSH banding), no corpus
  text needs a MinHash signature unless it is reported, and common code makes few candidates.
- ``runs``: tests with too few rare shingles (HumanEval's are numbers and the harness name
  ``candidate``) are screened by their token runs instead: runs of twice ``span_tokens`` tokens
  that start at a call of the harness (a shingle holding a name that the tests of half the tasks
  call and that is not common in code, repeated in the test: ``candidate (``, ``assert candidate``), hold
  at least four numbers, and are not boilerplate. The shingle prefilter finds the few corpus
  texts holding such a shingle, and only those are read for runs. A text is a copy when it holds
  the same share of those runs, the containment, and the aligned span coverage in runs of that
  length. Shorter runs, or fewer numbers, are repeated by chance in a harness full of other tests
  of ``candidate`` on small numbers. Code is never screened that way: ``if n == 0: return 0`` ...
  ``fib(n - 2)`` is an idiom, not evidence of a copy.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

import numpy as np

from leakray.screen.candidates import KeyFilter, RunIndex, SortedKeys
from leakray.screen.minhash import SCHEME, MinHasher, permutations
from leakray.screen.parts import PARTS
from leakray.screen.rarity import common_tokens, shingle_commonness
from leakray.screen.shingle import (TOKENIZER_NAME, VALUE_BITS, ShingleSets, as_bytes, close, fold, fold_open, run_grams,
                                    run_values, shingle_batch, token_sequence)

EPS = 1e-9
BOILERPLATE_MIN_TASKS = 3  # a shingle (or run) in the texts of this many tasks ...
BOILERPLATE_SHARE = 0.02  # ... and of this share of them is the benchmark's boilerplate, not evidence
# the token runs of data: twice the span of the aligned check, and holding this many numbers, so
# a harness full of other tests of `candidate` on small numbers does not repeat one by chance
RUN_SPANS = 2
RUN_NUMBERS = 4
NEVER = np.iinfo(np.int32).max  # the need of an entry that is not screened that way
_DIGIT = np.zeros(256, dtype=bool)  # by a token's first byte
_DIGIT[list(b"0123456789")] = True
_NAME = np.zeros(256, dtype=bool)
_NAME[list(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")] = True
_NAME[0x80:] = True
_OPEN = token_sequence("(")[0][0]  # a name before it is called


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
                "candidates": "every rare shingle indexed, exact (no LSH misses); number-bearing token runs "
                              "(1 in 4, by content) for parts with too few rare shingles",
                "run_tokens": RUN_SPANS * self.span_tokens, "run_numbers": RUN_NUMBERS, "minhash_scheme": SCHEME,
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


def implied_shared(rare: np.ndarray, size: np.ndarray, t: float) -> np.ndarray:
    """Rare shingles a text shares with an entry (`rare` of its `size` shingles) whenever their
    Jaccard or containment is >= t: it lacks at most (1 - t) * size of the entry's shingles."""
    return rare - np.floor((1.0 - t) * size + EPS).astype(np.int64)


class BenchmarkIndex:
    def __init__(self, config: ScreenConfig, texts: list[str], groups=None, data=None):
        """`groups`: the task of each text (parts of one task count once for boilerplate); `data`:
        which texts are data (a task's tests) and may be screened by their number-bearing runs
        when they have too few rare shingles (default: none; code is not screened that way, since
        ``if n == 0: return 0`` ... is an idiom, not a copy)."""
        self.config = config
        self.n = len(texts)
        self.hasher = MinHasher(config.num_perm, config.seed)
        self.sets: ShingleSets = shingle_batch(texts, config.ngram)
        self.sizes = self.sets.sizes
        self.sigs = self.hasher.signatures(self.sets)
        seqs = [token_sequence(t) for t in texts]
        lens = np.fromiter((len(s[0]) for s in seqs), dtype=np.int64, count=self.n)
        self.token_values = np.concatenate([s[0] for s in seqs]) if seqs else np.empty(0, np.uint64)
        self.token_offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lens)])
        first_bytes = [np.frombuffer(as_bytes(t), dtype=np.uint8)[s[1]] for t, s in zip(texts, seqs)]
        kinds = [(_DIGIT[b], _NAME[b]) for b in first_bytes]  # each token: a number, a name
        self.run_tokens = RUN_SPANS * config.span_tokens  # the runs of data (tests) and their aligned check
        groups = np.asarray(groups if groups is not None else np.arange(self.n))
        self.n_groups = len(np.unique(groups)) if self.n else 0
        self._build_candidates(texts, groups)
        self._build_runs(groups, kinds, np.zeros(self.n, bool) if data is None else np.asarray(data, bool))
        # one prefilter for both: rare shingles, and the first shingles of indexed runs
        self.keyfilter = KeyFilter(self._open_keys(np.concatenate([self.keys, self.runs.first]) if self.runs
                                                   else self.keys))
        self.screenable = self.by_rare | self.by_runs
        self.contain_need = required_shared(self.sizes, config.containment or 1.0)

    @classmethod
    def for_entries(cls, config: ScreenConfig, entries) -> BenchmarkIndex:
        """The index of a screen's entries (`parts.Entries`): parts of a task grouped, tests as data."""
        return cls(config, entries.text, groups=entries.group_ids(), data=entries.data_mask())

    def tokens(self, e: int) -> np.ndarray:
        return self.token_values[self.token_offsets[e]:self.token_offsets[e + 1]]

    def _open_keys(self, values: np.ndarray) -> np.ndarray:
        """The entries' n-grams whose shingle values are among `values`, as the key filter reads
        them: before their last mixing step (`fold_open`). Read off all tokens in a row: an
        n-gram across two entries matches a key only by a 2^-48 collision (one more slot set)."""
        want = np.unique(values)
        open_values = fold_open(self.token_values, self.config.ngram)
        if len(want) == 0 or len(open_values) == 0:
            return np.empty(0, np.uint64)
        closed = close(open_values)
        hit = want[np.searchsorted(want, closed).clip(max=len(want) - 1)] == closed
        return np.unique(open_values[hit])

    def _boilerplate(self, values: np.ndarray, owner: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Which values are in the texts of many tasks (each task counted once)."""
        if len(values) == 0:
            return np.zeros(0, dtype=bool)
        task_key = np.unique(np.stack([values, groups[owner].astype(np.uint64)]), axis=1)  # (value, task) once
        uk, df = np.unique(task_key[0], return_counts=True)
        boiler = uk[df >= max(BOILERPLATE_MIN_TASKS, BOILERPLATE_SHARE * self.n_groups)]
        return np.isin(values, boiler)

    def _build_candidates(self, texts: list[str], groups: np.ndarray) -> None:
        cfg = self.config
        big_enough = self.sizes >= cfg.min_shingles  # shorter texts are too generic to call a copy
        values, owner = [], []
        for e in np.flatnonzero(big_enough):
            v, common = shingle_commonness(texts[e], cfg.ngram)
            if not np.array_equal(v, self.sets[e]):  # the two code paths must agree on every value
                raise AssertionError("shingle values differ between shingle_batch and shingle_commonness")
            values.append(v[common < cfg.ngram])
            owner.append(np.full(len(values[-1]), e, dtype=np.int32))
        keys = np.concatenate(values) if values else np.empty(0, np.uint64)
        owner = np.concatenate(owner) if owner else np.empty(0, np.int32)
        keep = ~self._boilerplate(keys, owner, groups)
        keys, owner = keys[keep], owner[keep]
        rare = np.bincount(owner, minlength=self.n).astype(np.int64)
        self.rare = rare
        self.by_rare = big_enough & (rare >= cfg.min_rare_shingles)
        # containment: samples long enough, with the rare-shingle share (chance matches of a short
        # sample in a large text are made of common shingles)
        self.contain_ok = (self.by_rare & (self.sizes >= cfg.min_containment_shingles) & (cfg.containment > 0))
        self.share = min(cfg.threshold, cfg.containment or 1.0)
        need_j = np.maximum(implied_shared(rare, self.sizes, cfg.threshold), cfg.min_rare_shingles)
        need_c = np.maximum.reduce([required_shared(rare, self.share),
                                    implied_shared(rare, self.sizes, cfg.containment),
                                    np.full(self.n, cfg.min_rare_shingles)])
        self.need_jaccard = np.where(self.by_rare, need_j, NEVER).astype(np.int64)
        self.need_contain = np.where(self.contain_ok, need_c, NEVER).astype(np.int64)
        self.need = np.minimum(self.need_jaccard, self.need_contain)  # a candidate hits this many
        order = np.argsort(keys, kind="stable")
        self.keys, self.owner = keys[order], owner[order]
        self.lookup = SortedKeys(self.keys)

    def _build_runs(self, groups: np.ndarray, token_kinds: list[tuple[np.ndarray, np.ndarray]],
                    data: np.ndarray) -> None:
        """The runs index of the data texts too generic for rare shingles."""
        cfg = self.config
        n = cfg.ngram
        grams_per_run = run_grams(n, self.run_tokens)
        span = n * grams_per_run
        eligible = (data & ~self.by_rare & (self.sizes >= max(cfg.min_shingles, cfg.min_containment_shingles))
                    & (cfg.containment > 0))
        # the harness: names the tests of at least half the tasks call (HumanEval's `candidate`)
        names = []
        for e in np.flatnonzero(data):
            th = self.tokens(e)
            called = np.zeros(len(th), dtype=bool)
            called[:-1] = th[1:] == _OPEN
            names.append(np.unique(th[token_kinds[e][1] & called & ~common_tokens(th)]))
        harness = np.empty(0, np.uint64)
        if names:
            named = np.concatenate(names)
            task_name = np.unique(np.stack([named, np.repeat(groups[data], [len(x) for x in names]).astype(np.uint64)]),
                                  axis=1)
            uk, df = np.unique(task_name[0], return_counts=True)
            harness = uk[df >= max(BOILERPLATE_MIN_TASKS, 0.5 * len(np.unique(groups[data])))]
        values, firsts, owner = [], [], []
        for e in np.flatnonzero(eligible):
            th = self.tokens(e)
            if len(th) < span or len(harness) == 0:
                continue
            grams = fold(th, n)
            m = len(th) - span + 1
            calls = np.convolve(np.isin(th, harness).astype(np.int64), np.ones(n, dtype=np.int64), mode="valid") > 0
            uniq, inverse, count = np.unique(grams, return_inverse=True, return_counts=True)
            repeated = count[inverse] >= 2  # a call shape the tests repeat, one run per test case
            numbers = np.convolve(token_kinds[e][0].astype(np.int64), np.ones(span, dtype=np.int64), mode="valid")
            p = np.flatnonzero((calls & repeated)[:m] & (numbers >= RUN_NUMBERS))
            v, first = np.unique(run_values(grams, p, n, grams_per_run), return_index=True)
            values.append(v)
            firsts.append(grams[p[first]] >> np.uint64(64 - VALUE_BITS))  # as a shingle value
            owner.append(np.full(len(v), e, dtype=np.int32))
        values = np.concatenate(values) if values else np.empty(0, np.uint64)
        firsts = np.concatenate(firsts) if firsts else np.empty(0, np.uint64)
        owner = np.concatenate(owner) if owner else np.empty(0, np.int32)
        keep = ~self._boilerplate(values, owner, groups)  # runs in many tasks' tests: shared asserts
        values, firsts, owner = values[keep], firsts[keep], owner[keep]
        self.n_runs = np.bincount(owner, minlength=self.n).astype(np.int64)
        self.by_runs = eligible & (self.n_runs >= cfg.min_rare_shingles)
        keep = self.by_runs[owner]
        values, firsts, owner = values[keep], firsts[keep], owner[keep]
        need = np.maximum(required_shared(self.n_runs, self.share), cfg.min_rare_shingles)
        self.need_runs = np.where(self.by_runs, need, NEVER).astype(np.int64)
        order = np.argsort(values, kind="stable")
        self.runs = (RunIndex(values[order], owner[order], np.unique(firsts), n, grams_per_run)
                     if len(values) else None)

    @property
    def nbytes(self) -> int:
        arrays = (self.sets.values, self.sets.offsets, self.sigs, self.token_values, self.token_offsets, self.keys,
                  self.owner, self.need, self.need_jaccard, self.need_contain, self.rare, self.sizes, self.screenable,
                  self.by_rare, self.by_runs, self.contain_ok, self.contain_need, self.keyfilter.table, self.n_runs,
                  self.need_runs)
        return (sum(a.nbytes for a in arrays) + self.lookup.nbytes
                + (self.runs.nbytes if self.runs is not None else 0))
