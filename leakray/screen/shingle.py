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
batch at once. One ``bytes.translate`` gives every byte its class (space 0, word 1, single-byte
token 2); a byte starts a token where its class is above its predecessor's word bit, and is a
token's last where it is above its successor's: two comparisons per byte. A token's value is its
bytes: its first 8-byte word masked to its length, plus, for the ~10% of tokens longer than 8
bytes, its last word and each whole word between, mixed with the length or the position. Short
tokens are not mixed on their own: n consecutive token values are folded into one shingle hash
(multiply-add, then the MurmurHash3 64-bit finaliser, per token), of which the top 48 bits are
kept. The corpus pass (`TextGrams`) stops before the last finaliser (`fold_open`): the key
filter reads those values, and only the n-grams it passes are finished. Nothing uses Python's
salted `hash()`, so the same text gives the same shingle hashes on every worker and every run.
48 bits leave the top 16 bits of a sort key for the document number, so one sort of a whole
chunk yields every document's sorted distinct shingles (two shingles share a hash with
probability ~2^-48 per pair).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

TOKEN_RE = re.compile(rb"[A-Za-z0-9_\x80-\xff]+|[^\sA-Za-z0-9_\x80-\xff]")
ESCAPE_RE = re.compile(rb"\\+[ntr]?")
TOKENIZER_NAME = "code-bytes-v3"  # recorded in summaries; bump if the rule or the hash below changes

# byte class: whitespace (and the backslash of an escape), a word byte, a single-byte token; the
# low bit marks word bytes (`_token_bounds` compares a class with its neighbour's low bit)
_SPACE, _WORD, _SINGLE = 0, 1, 2
_CLASS = np.full(256, _SINGLE, dtype=np.uint8)
for _b in b" \t\n\r\x0b\x0c\\":
    _CLASS[_b] = _SPACE
for _b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_":
    _CLASS[_b] = _WORD
_CLASS[0x80:] = _WORD
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
_LEN_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=_U64)  # by length, 8 = all
_PAD = 16  # whitespace after a chunk, so every 8-byte read at a token's start stays inside the buffer
_PAD_BYTES = b"\n" * _PAD
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


def _words(buf: np.ndarray) -> np.ndarray:
    """The 8 bytes from every offset of `buf` as little-endian uint64 (a view, no copy)."""
    return np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _classes(buf: bytes | bytearray) -> np.ndarray:
    """The class of every byte of `buf`; a backslash, and an n/t/r right after one, are spaces."""
    q = np.frombuffer(buf.translate(_CLASS_TABLE), dtype=np.uint8)  # writable for a bytearray
    if b"\\" in buf:
        raw = np.frombuffer(buf, dtype=np.uint8)
        after = np.flatnonzero(raw == 92) + 1
        after = after[after < len(raw)]
        after = after[_ESCAPED.take(raw.take(after))]
        if len(after):
            if not q.flags.writeable:
                q = q.copy()
            q[after] = _SPACE
    return q


def _token_bounds(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of every token, from the byte classes (which end with whitespace).

    A byte starts a token when its class is above its predecessor's word bit: a word byte after
    anything but a word byte, a single after anything, never a space. It ends one (is the
    token's last byte) when its class is above its successor's word bit, the same rule mirrored.
    Two comparisons per byte, no separate pass for singles."""
    word = q & _WORD
    start = np.empty(len(q), dtype=bool)
    start[0] = q[0] != _SPACE
    np.greater(q[1:], word[:-1], out=start[1:])
    end = np.empty(len(q), dtype=bool)  # the byte after a token's last
    end[0] = False
    np.greater(q[:-1], word[1:], out=end[1:])
    return np.flatnonzero(start), np.flatnonzero(end)


def _prepared(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes padded for `token_hashes`, token starts, token ends) of the texts joined, each
    followed by a line break: one copy of the bytes, writable, so the classes are fixed in place."""
    buf = bytearray(b"\n").join([*texts, _PAD_BYTES])
    starts, ends = _token_bounds(_classes(buf))
    return np.frombuffer(buf, dtype=np.uint8), starts, ends


def token_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position-independent 64-bit value of each token data[starts[i]:ends[i]], a function of its bytes.

    `data` (uint8) must hold `_PAD` bytes after the last token. A token of up to 8 bytes is its
    little-endian word masked to its length (injective: a token holds no zero byte but a lone
    NUL). A longer one XORs in its last 8 bytes mixed with its length, and each whole word
    between (over 16 bytes) mixed with its position, by fmix64: every byte counts, and only the
    ~10% of tokens over 8 bytes pay for their length. The shingle fold mixes every token
    (`fold`), so short ones are not mixed here.
    """
    if len(data) < _PAD:
        raise ValueError("token_hashes needs a buffer padded with 16 bytes")
    win = _words(data)
    lengths = ends - starts
    # take() copies a strided view whole, once: cheaper than fancy indexing for every token, but
    # the long tokens below are few, and fancy indexing reads them without that copy
    h = win.take(starts)
    h &= _LEN_MASKS.take(lengths, mode="clip")
    long = np.flatnonzero(lengths > 8)
    if len(long):
        with np.errstate(over="ignore"):
            # the token's last 8 bytes with its length: 9 to 16 bytes are covered (most long tokens)
            size = lengths[long]
            w = win[ends[long] - 8]
            w ^= size.view(_U64) * _LEN_MIX
            _fmix64_inplace(w)
            mid = np.flatnonzero(size > 16)
            if len(mid):  # and every whole word between the first and the last one
                w[mid] ^= _middle_words(win, starts[long[mid]], size[mid])
            h[long] ^= w
    return h


def _middle_words(win: np.ndarray, pos: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Per token over 16 bytes (at `pos`, of `size` bytes): the XOR of its whole words after the
    first and before the last, word k (1, 2, ...) mixed with k, by fmix64."""
    nw = (size - 9) >> 3  # words between: ceil(size / 8) - 2
    seg = np.cumsum(nw) - nw  # each token's first word in the flat list
    k = np.arange(int(seg[-1] + nw[-1])) - np.repeat(seg - 1, nw)
    with np.errstate(over="ignore"):
        w = win[np.repeat(pos, nw) + (k << 3)]
        w ^= k.view(_U64) * _WORD_MIX
        return np.bitwise_xor.reduceat(_fmix64_inplace(w), seg)


def token_sequence(text: str | bytes) -> tuple[np.ndarray, np.ndarray]:
    """(token hashes, start offsets) of one text, in order (aligned verification)."""
    data, starts, ends = _prepared([as_bytes(text)])
    return token_hashes(data, starts, ends), starts


def fold(th: np.ndarray, n: int) -> np.ndarray:
    """Hash of every run of n consecutive token values (len(th) - n + 1 values, full 64 bits):
    multiply-add each next token, then fmix64, so every run is mixed even where n is 1."""
    return _fmix64_inplace(fold_open(th, n))


def fold_open(th: np.ndarray, n: int) -> np.ndarray:
    """`fold` before its last fmix64, a bijection: the key filter reads these (`KeyFilter`), and
    only the few n-grams it passes pay for the last mixing (`close`)."""
    m = len(th) - n + 1
    if m <= 0:
        return np.empty(0, _U64)
    with np.errstate(over="ignore"):
        sh = np.multiply(th[:m], _NGRAM_MIX)
        for j in range(1, n):
            sh += th[j:j + m]
            if j < n - 1:
                _fmix64_inplace(sh)
                sh *= _NGRAM_MIX
    return sh


def close(open_values: np.ndarray) -> np.ndarray:
    """Shingle values (top VALUE_BITS bits of `fold`) of `fold_open` values, in a new array."""
    return _fmix64_inplace(open_values.copy()) >> _DROP


def run_grams(ngram: int, span_tokens: int) -> int:
    """How many n-grams, side by side, make a token run of at least `span_tokens` tokens."""
    return max(1, -(-span_tokens // ngram))


def run_values(grams: np.ndarray, positions: np.ndarray, ngram: int, count: int) -> np.ndarray:
    """48-bit value of the token run starting at each position: the `count` n-grams that tile it
    (their full-width `fold` values at p, p + n, ...), multiply-added and mixed. The caller
    makes sure every run lies inside its text."""
    with np.errstate(over="ignore"):
        v = grams[positions]
        for k in range(1, count):
            v *= _NGRAM_MIX
            v += grams[positions + k * ngram]
        return _fmix64_inplace(v) >> _DROP


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


def _chunk_grams(docs: list[bytes], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """(grams, tok_end) of documents joined into one text: `fold_open` of every run of `ngram`
    tokens, runs that cross into the next document included; and the number of tokens before
    each document's end (document d's tokens are tok_end[d-1]:tok_end[d])."""
    data, starts, ends = _prepared(docs)
    th = token_hashes(data, starts, ends)
    doc_end = np.cumsum(np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs)))
    return fold_open(th, ngram), np.searchsorted(starts, doc_end)


def _shingle_chunk(docs: list[bytes], ngram: int) -> ShingleSets:
    ndoc = len(docs)
    sh, tok_end = _chunk_grams(docs, ngram)
    _fmix64_inplace(sh)
    m = len(sh)
    if m == 0:
        return ShingleSets(np.empty(0, _U64), np.zeros(ndoc + 1, np.int64))
    sh >>= _DROP
    # the document of every n-gram in the top bits; an n-gram that crosses into the next document
    # is not a shingle: it goes to document `ndoc`, which sorts last and is cut off below
    per_doc = np.diff(np.minimum(tok_end, m), prepend=0)  # n-grams starting in each document
    sh |= np.repeat(np.arange(ndoc, dtype=_U64) << _DOC_SHIFT, per_doc)
    for j in range(1, ngram):
        cut = tok_end - j
        sh[cut[(cut >= 0) & (cut < m)]] = _U64(ndoc) << _DOC_SHIFT
    sh.sort()  # by document, then by value: every document's shingles sorted in one pass
    keep = np.empty(m, dtype=bool)
    keep[0] = True
    np.not_equal(sh[1:], sh[:-1], out=keep[1:])
    sh = sh[keep]
    offsets = np.searchsorted(sh, np.arange(ndoc + 1, dtype=_U64) << _DOC_SHIFT)
    sh = sh[:offsets[-1]]
    sh &= VALUE_MASK
    return ShingleSets(sh, offsets.astype(np.int64))


def shingle_batch(texts: Sequence[str | bytes], ngram: int = 2, chunk_bytes: int = CHUNK_BYTES) -> ShingleSets:
    """Distinct n-gram shingle hashes of each text; documents with fewer than `ngram` tokens get none."""
    if ngram < 1:
        raise ValueError("ngram must be >= 1")
    return ShingleSets.concat([_shingle_chunk(docs, ngram) for docs in _chunks(texts, chunk_bytes)])


def _chunks(texts: Sequence[str | bytes], chunk_bytes: int) -> list[list[bytes]]:
    """The texts as bytes, in runs of about `chunk_bytes` (at least one text each)."""
    chunks, cur, size = [], [], 0
    for t in texts:
        d = as_bytes(t)
        if cur and (size + len(d) > chunk_bytes or len(cur) >= MAX_DOCS_PER_CHUNK - 1):
            chunks.append(cur)
            cur, size = [], 0
        cur.append(d)
        size += len(d) + 1
    if cur:
        chunks.append(cur)
    return chunks


class TextGrams:
    """The n-grams of many texts in text order, repeats kept: what the corpus pass needs.

    `shingle_batch` sorts every text's n-grams to get its distinct set, the costliest step of a
    corpus pass; but most corpus texts share nothing rare with a benchmark. Here the key filter
    reads the n-grams as they come (`select`), before their last mixing step (`fold_open`), and
    only the n-grams it passes, and the few candidate texts, get their shingle values (`close`,
    the values of `shingle_batch`) and sorted distinct sets (`distinct`)."""

    def __init__(self, texts: Sequence[str | bytes], ngram: int = 2, chunk_bytes: int = CHUNK_BYTES):
        if ngram < 1:
            raise ValueError("ngram must be >= 1")
        self.ngram = ngram
        self._grams: list[np.ndarray] = []  # per chunk: its joined texts' open n-grams, crossing ones too
        chunk, first, count = [], [], []
        for docs in _chunks(texts, chunk_bytes):
            grams, tok_end = _chunk_grams(docs, ngram)
            tok_start = np.concatenate([np.zeros(1, np.int64), tok_end[:-1]])
            chunk.append(np.full(len(docs), len(self._grams), dtype=np.int64))
            first.append(tok_start)  # a text's n-grams start at its first token
            count.append(np.maximum(tok_end - tok_start - (ngram - 1), 0))
            self._grams.append(grams)
        cat = np.concatenate if chunk else (lambda _: np.empty(0, np.int64))
        self.chunk, self.first, self.count = cat(chunk), cat(first), cat(count)  # of each text
        self._bounds = np.searchsorted(self.chunk, np.arange(len(self._grams) + 1))  # texts of each chunk

    def __len__(self) -> int:
        return len(self.count)

    def of(self, row: int) -> np.ndarray:
        """Shingle values of one text, in order, repeats kept."""
        return close(self._open(row))

    def _open(self, row: int, head: int | None = None) -> np.ndarray:
        """Open n-grams of one text (its first `head`), a view."""
        f = int(self.first[row])
        n = int(self.count[row]) if head is None else head
        return self._grams[int(self.chunk[row])][f:f + n]

    def select(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(values, rows): the shingles at `positions(grams)` of each chunk's open n-grams, and
        the text of each; n-grams that cross into the next text are dropped, repeats kept."""
        values, rows = [], []
        for c, grams in enumerate(self._grams):
            pos = positions(grams)
            lo, hi = self._bounds[c], self._bounds[c + 1]
            # the last text starting at or before each n-gram (empty texts share their start)
            row = np.searchsorted(self.first[lo:hi], pos, side="right") + (lo - 1)
            inside = (pos - self.first[row]) < self.count[row]
            values.append(close(grams[pos[inside]]))
            rows.append(row[inside])
        if not values:
            return np.empty(0, _U64), np.empty(0, np.int64)
        return np.concatenate(values), np.concatenate(rows)

    def distinct(self, rows: np.ndarray) -> ShingleSets:
        """The sorted distinct shingles of these texts (as `shingle_batch` gives them), in order."""
        return _distinct_sets([self._open(r) for r in np.asarray(rows).tolist()])

    def distinct_floor(self, rows: np.ndarray, limit: np.ndarray | int) -> np.ndarray:
        """Per text: its number of distinct shingles where that is at most `limit` (per row), else
        a number above `limit`. Counted on its first 4 (limit + 1) n-grams, and on the whole text
        only where those hold too few: a large text is ruled out without sorting all its shingles."""
        rows = np.asarray(rows, dtype=np.int64)
        limit = np.broadcast_to(np.asarray(limit, dtype=np.int64), rows.shape)
        head = np.minimum(self.count[rows], 4 * (limit + 1))
        n = _distinct_sets([self._open(r, h) for r, h in zip(rows.tolist(), head.tolist())]).sizes
        again = np.flatnonzero((n <= limit) & (head < self.count[rows]))
        n[again] = _distinct_sets([self._open(r) for r in rows[again].tolist()]).sizes
        return n


def _distinct_sets(pieces: list[np.ndarray]) -> ShingleSets:
    """The sorted distinct shingle values of each array of open n-grams: one pass to close them
    and one sort per group of arrays, the array's number in the top bits (as in `_shingle_chunk`)."""
    parts = []
    for g in range(0, max(len(pieces), 1), MAX_DOCS_PER_CHUNK - 1):
        group = pieces[g:g + MAX_DOCS_PER_CHUNK - 1]
        sizes = np.fromiter((len(p) for p in group), dtype=np.int64, count=len(group))
        v = np.concatenate(group) if group else np.empty(0, _U64)
        _fmix64_inplace(v)
        v >>= _DROP
        v |= np.repeat(np.arange(len(group), dtype=_U64) << _DOC_SHIFT, sizes)
        v.sort()
        keep = np.empty(len(v), dtype=bool)
        keep[:1] = True
        np.not_equal(v[1:], v[:-1], out=keep[1:])
        v = v[keep]
        offsets = np.searchsorted(v, np.arange(len(group) + 1, dtype=_U64) << _DOC_SHIFT)
        v &= VALUE_MASK
        parts.append(ShingleSets(v, offsets.astype(np.int64)))
    return ShingleSets.concat(parts)
