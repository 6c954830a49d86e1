"""Code tokens -> n-gram shingles -> stable 64-bit shingle hashes, vectorised over many documents.

The tokenizer is one rule, the same for benchmark samples and corpus files, on UTF-8 bytes:

    a token is a maximal run of word bytes ``[A-Za-z0-9_]`` or any byte >= 0x80
    (identifiers, numbers, keywords, non-ASCII words), or one single other
    non-whitespace byte (operators and punctuation, one character each, so
    ``a==b`` and ``a == b`` tokenize the same).

`tokenize` is the readable regex form; `shingle_batch` is the same rule in numpy over a whole
batch at once: a byte-class lookup finds token boundaries, each token is hashed from its bytes
(two 8-byte words for tokens up to 16 bytes, a polynomial mod 2^64 beyond), and n consecutive
token hashes are folded into one shingle hash with the MurmurHash3 64-bit finaliser. Nothing uses Python's salted `hash()`,
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
_BYTE_PLUS_1 = np.arange(1, 257, dtype=np.uint64)
_P = _U64(0x100000001B3)  # FNV prime, odd: invertible mod 2^64
_LEN_MIX = _U64(0x9E3779B97F4A7C15)
_NGRAM_MIX = _U64(0xC2B2AE3D27D4EB4F)
_M1, _M2 = _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)
_S33 = _U64(33)

_pow_cache: list[np.ndarray] = [np.ones(1, _U64)]


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (a bijection that avalanches), element-wise, wrapping."""
    h = h ^ (h >> _S33)
    h = h * _M1
    h = h ^ (h >> _S33)
    h = h * _M2
    return h ^ (h >> _S33)


def _powers(n: int) -> np.ndarray:
    """P^i mod 2^64 for i < n (cached, grown by doubling)."""
    pw = _pow_cache[0]
    if len(pw) < n:
        size = max(n, 2 * len(pw), 1 << 12)
        with np.errstate(over="ignore"):
            pw = np.concatenate([np.ones(1, _U64), np.cumprod(np.full(size - 1, _P, dtype=_U64))])
        _pow_cache[0] = pw
    return pw


def as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")


def tokenize(text: str | bytes) -> list[bytes]:
    """The tokenizer, readable form (tests check `shingle_batch` against it)."""
    return TOKEN_RE.findall(as_bytes(text))


def shingles_reference(text: str | bytes, ngram: int = 2) -> set[tuple[bytes, ...]]:
    """The shingle set as tuples of tokens (slow; for tests and explanations)."""
    toks = tokenize(text)
    return {tuple(toks[i:i + ngram]) for i in range(len(toks) - ngram + 1)}


_SHORT = 16  # tokens up to this many bytes are hashed from two 8-byte words, longer ones polynomially
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=_U64)
_LONG_TAG = _U64(0x632BE59BD9B4E019)


def token_hashes(padded: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position-independent 64-bit hash of each token padded[starts[i]:ends[i]], a function of its bytes only.

    A token of at most 16 bytes is exactly its two little-endian 8-byte words (zero-padded) and
    its length; those are mixed with fmix64 (no per-byte pass). A longer token is hashed with
    a polynomial mod 2^64 over its bytes (prefix sums over those tokens' bytes only).
    `padded` (uint8, contiguous) must hold 16 zero bytes after the last token.
    """
    if not padded.flags.c_contiguous or len(padded) < _SHORT:
        raise ValueError("token_hashes needs a contiguous buffer padded with 16 bytes")
    lengths = (ends - starts).astype(np.int64)
    win = np.ndarray((len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))  # 8 bytes from every offset
    with np.errstate(over="ignore"):
        w0 = win.take(starts) & _MASKS.take(np.minimum(lengths, 8))
        w1 = win.take(starts + 8) & _MASKS.take(np.clip(lengths - 8, 0, 8))
        out = fmix64(w0 ^ ((w1 + lengths.astype(_U64) * _LEN_MIX) * _NGRAM_MIX))
        long = np.flatnonzero(lengths > _SHORT)
        if len(long):
            ls, ll = starts[long], lengths[long]
            total = int(ll.sum())
            seg = np.cumsum(ll) - ll
            pos_in = np.arange(total) - np.repeat(seg, ll)
            v = _BYTE_PLUS_1.take(padded.take(np.repeat(ls, ll) + pos_in)) * _powers(int(ll.max())).take(pos_in)
            raw = np.add.reduceat(v, seg)
            out[long] = fmix64((raw + ll.astype(_U64) * _LEN_MIX) ^ _LONG_TAG)
    return out


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
    joined = b"\n".join(docs) + b"\n"
    padded = np.frombuffer(joined + bytes(_SHORT), dtype=np.uint8)  # zero tail for 8-byte reads
    buf = padded[: len(joined)]
    lens = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=ndoc)
    doc_starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(lens)[:-1]])
    cls = _CLASS.take(buf)
    word = cls == 1
    is_start = cls == 2  # single-byte tokens start and end where they are
    is_end = is_start.copy()
    is_start[0] |= word[0]
    is_start[1:] |= word[1:] > word[:-1]  # a word byte after a non-word byte
    is_end[:-1] |= word[:-1] > word[1:]  # a word byte before a non-word byte (buf ends with "\n")
    starts = np.flatnonzero(is_start)
    ends = np.flatnonzero(is_end) + 1
    th = token_hashes(padded, starts, ends)
    per_doc = np.diff(np.searchsorted(starts, np.append(doc_starts, len(buf))))
    tdoc = np.repeat(np.arange(ndoc), per_doc)
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
