"""Code tokens -> n-gram shingles -> stable 48-bit shingle hashes, vectorised over many documents.

The tokenizer is one rule, the same for benchmark samples and corpus texts, on UTF-8 bytes:

    a token is a maximal run of word bytes ``[A-Za-z0-9_]`` or any byte >= 0x80
    (identifiers, numbers, keywords, non-ASCII words), or one single other
    non-whitespace byte (operators and punctuation, one character each, so
    ``a==b`` and ``a == b`` tokenize the same).

Escapes count as whitespace: a backslash, and an ``n``/``t``/``r`` right after one, separate
tokens and are not tokens. So code held in a string literal (``"def f(x):\\n    return x"`` in
a .py file, a JSON string inside a JSON string, a Python ``repr``) tokenizes like the code
itself, at any depth of escaping, and ``\\"`` is a plain ``"``.

`tokenize` is the readable regex form; `shingle_batch` is the same rule in numpy over a whole
batch at once: a byte-class table (``bytes.translate``) finds token boundaries, each token is
hashed from its bytes (its first 8-byte word, plus a sum of mixed words for longer tokens),
and n consecutive token hashes are folded into one shingle hash with the MurmurHash3 64-bit
finaliser, of which the top 48 bits are kept. Nothing uses Python's salted `hash()`, so the
same text gives the same shingle hashes on every worker and every run. 48 bits leave the top
16 bits of a sort key for the document number, so one sort of a whole chunk yields every
document's sorted distinct shingles (two shingles share a hash with probability ~2^-48 per pair).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

TOKEN_RE = re.compile(rb"[A-Za-z0-9_\x80-\xff]+|[^\sA-Za-z0-9_\x80-\xff]")
ESCAPE_RE = re.compile(rb"\\+[ntr]?")
TOKENIZER_NAME = "code-bytes-v2"  # recorded in summaries; bump if the rule or the hash below changes

# byte class: 0 whitespace (and the backslash of an escape), 1 word, 2 single-byte token
_CLASS = np.full(256, 2, dtype=np.uint8)
for _b in b" \t\n\r\x0b\x0c\\":
    _CLASS[_b] = 0
for _b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_":
    _CLASS[_b] = 1
_CLASS[0x80:] = 1
_CLASS_TABLE = _CLASS.tobytes()
_ESCAPED = np.zeros(256, dtype=bool)
_ESCAPED[list(b"ntr")] = True

_U64 = np.uint64
VALUE_BITS = 48
_DOC_SHIFT = _U64(VALUE_BITS)
VALUE_MASK = _U64((1 << VALUE_BITS) - 1)
MAX_DOCS_PER_CHUNK = 1 << (64 - VALUE_BITS)
_DROP = _U64(64 - VALUE_BITS)
_LEN_MIX = _U64(0x9E3779B97F4A7C15)
_WORD_MIX = _U64(0x632BE59BD9B4E019)
_NGRAM_MIX = _U64(0xC2B2AE3D27D4EB4F)
_M1, _M2 = _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)
_S33 = _U64(33)
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=_U64)
_PAD = 16  # zero bytes after a chunk, so every 8-byte read at a token start stays inside the buffer
CHUNK_BYTES = 1 << 18  # a chunk's arrays stay in cache (measured: 256 KiB chunks ~2x faster than 4 MiB)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (a bijection that avalanches), element-wise, wrapping."""
    h = h ^ (h >> _S33)
    h = h * _M1
    h = h ^ (h >> _S33)
    h = h * _M2
    return h ^ (h >> _S33)


def _fmix64_inplace(h: np.ndarray) -> np.ndarray:
    t = h >> _S33
    h ^= t
    h *= _M1
    np.right_shift(h, _S33, out=t)
    h ^= t
    h *= _M2
    np.right_shift(h, _S33, out=t)
    h ^= t
    return h


def as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")


def tokenize(text: str | bytes) -> list[bytes]:
    """The tokenizer, readable form (tests check `shingle_batch` against it)."""
    return TOKEN_RE.findall(ESCAPE_RE.sub(b" ", as_bytes(text)))


def shingles_reference(text: str | bytes, ngram: int = 2) -> set[tuple[bytes, ...]]:
    """The shingle set as tuples of tokens (slow; for tests and explanations)."""
    toks = tokenize(text)
    return {tuple(toks[i:i + ngram]) for i in range(len(toks) - ngram + 1)}


def _bounds(joined: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of every token in `joined` (which must end with whitespace)."""
    cls = np.frombuffer(joined.translate(_CLASS_TABLE), dtype=np.uint8)
    if b"\\" in joined:
        buf = np.frombuffer(joined, dtype=np.uint8)
        after = np.flatnonzero(buf == 92) + 1
        after = after[after < len(buf)]
        cls = cls.copy()
        cls[after[_ESCAPED.take(buf.take(after))]] = 0
    word = cls == 1
    is_start = cls == 2  # single-byte tokens start and end where they are
    is_end = is_start.copy()
    is_start[0] |= word[0]
    is_start[1:] |= word[1:] > word[:-1]  # a word byte after a non-word byte
    is_end[:-1] |= word[:-1] > word[1:]  # a word byte before a non-word byte
    return np.flatnonzero(is_start), np.flatnonzero(is_end) + 1


def token_hashes(padded: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position-independent 64-bit hash of each token padded[starts[i]:ends[i]], a function of its bytes only.

    A token of up to 8 bytes is its little-endian 8-byte word (zero-padded) and its length,
    mixed with fmix64 (no per-byte pass). A longer one adds the sum of its further 8-byte words,
    each mixed with its position, so only the ~2% of tokens over 8 bytes pay for their length.
    `padded` (uint8, contiguous) must hold 16 zero bytes after the last token.
    """
    if not padded.flags.c_contiguous or len(padded) < _PAD:
        raise ValueError("token_hashes needs a contiguous buffer padded with 16 bytes")
    lengths = ends - starts
    win = np.ndarray((len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))  # 8 bytes from every offset
    with np.errstate(over="ignore"):
        h = lengths.astype(_U64)
        h *= _LEN_MIX
        w0 = win.take(starts)
        w0 &= _MASKS.take(np.minimum(lengths, 8))
        h ^= w0
        long = np.flatnonzero(lengths > 8)
        if len(long):
            ls, ll = starts[long], lengths[long]
            nw = (ll + 7) // 8 - 1  # words after the first
            seg = np.cumsum(nw) - nw
            k = np.arange(int(nw.sum())) - np.repeat(seg, nw) + 1
            w = win.take(np.repeat(ls, nw) + 8 * k)
            w &= _MASKS.take(np.minimum(np.repeat(ll, nw) - 8 * k, 8))
            w ^= k.astype(_U64) * _WORD_MIX
            h[long] ^= np.add.reduceat(_fmix64_inplace(w), seg)
        return _fmix64_inplace(h)


def token_sequence(text: str | bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token hashes, start offsets, end offsets) of one text, in order (aligned verification)."""
    data = as_bytes(text) + b"\n"
    starts, ends = _bounds(data)
    padded = np.frombuffer(data + bytes(_PAD), dtype=np.uint8)
    return token_hashes(padded, starts, ends), starts, ends


def fold(th: np.ndarray, n: int) -> np.ndarray:
    """Hash of every run of n consecutive token hashes (len(th) - n + 1 values, full 64 bits)."""
    m = len(th) - n + 1
    if m <= 0:
        return np.empty(0, _U64)
    sh = th[:m].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            sh *= _NGRAM_MIX
            sh += th[j:j + m]
            _fmix64_inplace(sh)
    return sh


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

    def rows(self) -> np.ndarray:
        """The document of every value."""
        return np.repeat(np.arange(len(self)), self.sizes)

    @classmethod
    def concat(cls, parts: Sequence[ShingleSets]) -> ShingleSets:
        if not parts:
            return cls(np.empty(0, _U64), np.zeros(1, np.int64))
        if len(parts) == 1:
            return parts[0]
        values = np.concatenate([p.values for p in parts])
        offs, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            offs.append(p.offsets[1:] + base)
            base += int(p.offsets[-1])
        return cls(values, np.concatenate(offs))


def _shingle_chunk(docs: list[bytes], ngram: int) -> ShingleSets:
    ndoc = len(docs)
    joined = b"\n".join(docs) + b"\n"
    starts, ends = _bounds(joined)
    th = token_hashes(np.frombuffer(joined + bytes(_PAD), dtype=np.uint8), starts, ends)
    doc_end = np.cumsum(np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=ndoc))
    tdoc = np.searchsorted(doc_end, starts, side="right")  # document of every token
    sh = fold(th, ngram)
    m = len(sh)
    if m == 0:
        return ShingleSets(np.empty(0, _U64), np.zeros(ndoc + 1, np.int64))
    sdoc = tdoc[:m]
    sh >>= _DROP
    sh |= sdoc.astype(_U64) << _DOC_SHIFT
    if ngram > 1:
        sh = sh[sdoc == tdoc[ngram - 1:]]  # n-grams that cross a document boundary are not shingles
    sh.sort()  # by document, then by value: every document's shingles sorted in one pass
    if len(sh):
        keep = np.empty(len(sh), dtype=bool)
        keep[0] = True
        np.not_equal(sh[1:], sh[:-1], out=keep[1:])
        sh = sh[keep]
    doc = (sh >> _DOC_SHIFT).astype(np.int64)
    offsets = np.searchsorted(doc, np.arange(ndoc + 1))
    sh &= VALUE_MASK
    return ShingleSets(sh, offsets.astype(np.int64))


def shingle_batch(texts: Sequence[str | bytes], ngram: int = 2, chunk_bytes: int = CHUNK_BYTES) -> ShingleSets:
    """Distinct n-gram shingle hashes of each text; documents with fewer than `ngram` tokens get none."""
    if ngram < 1:
        raise ValueError("ngram must be >= 1")
    docs = [as_bytes(t) for t in texts]
    parts, cur, size = [], [], 0
    for d in docs:
        if cur and (size + len(d) > chunk_bytes or len(cur) >= MAX_DOCS_PER_CHUNK - 1):
            parts.append(_shingle_chunk(cur, ngram))
            cur, size = [], 0
        cur.append(d)
        size += len(d) + 1
    if cur:
        parts.append(_shingle_chunk(cur, ngram))
    return ShingleSets.concat(parts)
