"""Code tokens -> n-gram shingles -> stable 64-bit shingle hashes, vectorised over many documents.

The tokenizer is one rule, the same for benchmark samples and corpus files, on UTF-8 bytes:

    a token is a maximal run of word bytes ``[A-Za-z0-9_]`` or any byte >= 0x80
    (identifiers, numbers, keywords, non-ASCII words), or one single other
    non-whitespace byte (operators and punctuation, one character each, so
    ``a==b`` and ``a == b`` tokenize the same).

`tokenize` is the readable regex form; `shingle_batch` is the same rule in numpy over a whole
batch at once: a byte-class lookup finds token boundaries, a polynomial prefix sum (mod 2^64)
gives every token a position-independent hash, and n consecutive token hashes are folded into
one shingle hash with the MurmurHash3 64-bit finaliser. Nothing uses Python's salted `hash()`,
so the same text gives the same shingle hashes on every worker and every run.

The shingle set of a document is its set of distinct shingle hashes; exact Jaccard and
containment are computed on these sets (the very values that were MinHashed). Two different
shingles share a hash with probability ~2^-64 per pair.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

TOKEN_RE = re.compile(rb"[A-Za-z0-9_\x80-\xff]+|[^\sA-Za-z0-9_\x80-\xff]")
TOKENIZER_NAME = "code-bytes-v1"  # recorded in summaries; bump if the rule above changes

# byte class: 0 whitespace, 1 word, 2 single-byte token
_CLASS = np.full(256, 2, dtype=np.uint8)
for _b in b" \t\n\r\x0b\x0c":
    _CLASS[_b] = 0
for _b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_":
    _CLASS[_b] = 1
_CLASS[0x80:] = 1

_U64 = np.uint64
_P = _U64(0x100000001B3)  # FNV prime, odd: invertible mod 2^64
_P_INV = _U64(pow(0x100000001B3, -1, 1 << 64))
_LEN_MIX = _U64(0x9E3779B97F4A7C15)
_NGRAM_MIX = _U64(0xC2B2AE3D27D4EB4F)
_M1, _M2 = _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)
_S33 = _U64(33)

_pow_cache: dict[str, np.ndarray] = {"pow": np.ones(1, _U64), "inv": np.ones(1, _U64)}


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (a bijection that avalanches), element-wise, wrapping."""
    h = h ^ (h >> _S33)
    h = h * _M1
    h = h ^ (h >> _S33)
    h = h * _M2
    return h ^ (h >> _S33)


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P^i and P^-i mod 2^64 for i < n (cached, grown by doubling)."""
    pw, inv = _pow_cache["pow"], _pow_cache["inv"]
    if len(pw) < n:
        size = max(n, 2 * len(pw), 1 << 16)
        with np.errstate(over="ignore"):
            pw = np.cumprod(np.full(size, _P, dtype=_U64))
            inv = np.cumprod(np.full(size, _P_INV, dtype=_U64))
        pw = np.concatenate([np.ones(1, _U64), pw[:-1]])
        inv = np.concatenate([np.ones(1, _U64), inv[:-1]])
        _pow_cache["pow"], _pow_cache["inv"] = pw, inv
    return pw, inv


def as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")


def tokenize(text: str | bytes) -> list[bytes]:
    """The tokenizer, readable form (tests check `shingle_batch` against it)."""
    return TOKEN_RE.findall(as_bytes(text))


def shingles_reference(text: str | bytes, ngram: int = 2) -> set[tuple[bytes, ...]]:
    """The shingle set as tuples of tokens (slow; for tests and explanations)."""
    toks = tokenize(text)
    return {tuple(toks[i:i + ngram]) for i in range(len(toks) - ngram + 1)}


def token_hashes(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position-independent 64-bit hash of each token buf[starts[i]:ends[i]]."""
    n = len(buf)
    pw, inv = _powers(n + 1)
    with np.errstate(over="ignore"):
        prefix = np.empty(n + 1, dtype=_U64)
        prefix[0] = 0
        np.cumsum((buf.astype(_U64) + _U64(1)) * pw[:n], out=prefix[1:])
        raw = (prefix[ends] - prefix[starts]) * inv[starts]
        lengths = (ends - starts).astype(_U64)
        return fmix64(raw + lengths * _LEN_MIX)


class ShingleSets:
    """Distinct shingle hashes of many documents, CSR-style: document i owns
    ``values[offsets[i]:offsets[i+1]]`` (sorted ascending, unique)."""

    __slots__ = ("values", "offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values, self.offsets = values, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    @classmethod
    def concat(cls, parts: Sequence[ShingleSets]) -> ShingleSets:
        if not parts:
            return cls(np.empty(0, _U64), np.zeros(1, np.int64))
        values = np.concatenate([p.values for p in parts])
        offs, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            offs.append(p.offsets[1:] + base)
            base += int(p.offsets[-1])
        return cls(values, np.concatenate(offs))


def _shingle_chunk(docs: list[bytes], ngram: int) -> ShingleSets:
    ndoc = len(docs)
    buf = np.frombuffer(b"\n".join(docs) + b"\n", dtype=np.uint8)
    lens = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=ndoc)
    doc_starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(lens)[:-1]])
    cls = _CLASS[buf]
    word = cls == 1
    prev_word = np.concatenate([[False], word[:-1]])
    next_word = np.concatenate([word[1:], [False]])
    single = cls == 2
    starts = np.flatnonzero(single | (word & ~prev_word))
    ends = np.flatnonzero(single | (word & ~next_word)) + 1
    th = token_hashes(buf, starts, ends)
    tdoc = np.searchsorted(doc_starts, starts, side="right") - 1
    m = len(th) - ngram + 1
    if m <= 0:
        return ShingleSets(np.empty(0, _U64), np.zeros(ndoc + 1, np.int64))
    with np.errstate(over="ignore"):
        sh = th[:m].copy()
        for j in range(1, ngram):
            sh = fmix64(sh * _NGRAM_MIX + th[j:j + m])
    keep = tdoc[:m] == tdoc[ngram - 1:ngram - 1 + m]
    sh, sdoc = sh[keep], tdoc[:m][keep]
    counts = np.bincount(sdoc, minlength=ndoc)
    offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)])
    for i in np.flatnonzero(counts > 1):  # in-place sort of each document's run
        sh[offsets[i]:offsets[i + 1]].sort()
    first = np.ones(len(sh), dtype=bool)
    first[1:] = (sh[1:] != sh[:-1]) | (sdoc[1:] != sdoc[:-1])
    sh, sdoc = sh[first], sdoc[first]
    counts = np.bincount(sdoc, minlength=ndoc)
    return ShingleSets(sh, np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)]))


def shingle_batch(texts: Sequence[str | bytes], ngram: int = 2, chunk_bytes: int = 1 << 20) -> ShingleSets:
    """Distinct n-gram shingle hashes of each text; documents with fewer than `ngram` tokens get none."""
    if ngram < 1:
        raise ValueError("ngram must be >= 1")
    docs = [as_bytes(t) for t in texts]
    parts, cur, size = [], [], 0
    for d in docs:
        if cur and size + len(d) > chunk_bytes:
            parts.append(_shingle_chunk(cur, ngram))
            cur, size = [], 0
        cur.append(d)
        size += len(d) + 1
    if cur:
        parts.append(_shingle_chunk(cur, ngram))
    return ShingleSets.concat(parts)
