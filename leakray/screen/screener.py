"""The corpus stage on one batch: read -> shingle -> rare-shingle candidates -> exact verify ->
aligned span check (containment) -> pairs with provenance.

Plain Python on batches; `leakray.executor.screen` runs `BatchScreener` inside Ray Data.
Every batch returns its verified pairs and counters: files (in, screened, skipped by reason),
documents (a file, or a record of a shard), texts (screened, skipped by reason), candidates, pairs.
"""

from __future__ import annotations

import hashlib
import lzma
import time
import zlib
from collections import Counter

import numpy as np
import pyarrow as pa

from leakray.screen.candidates import expand_matches
from leakray.screen.corpus import EXAMPLES_PER_REASON
from leakray.screen.columns import S
from leakray.screen.index import EPS, BenchmarkIndex
from leakray.screen.minhash import estimate_jaccard
from leakray.screen.readers import Piece, Reader, Skip, check_bytes
from leakray.screen.shingle import shingle_batch, token_sequence
from leakray.screen.verify import Runs, aligned_span, intersections

# keys of a worker's pair record beyond the S columns
ENTRY = "entry"  # row of the index (driver maps it to benchmark, task_id, part, text)
MAX_SHEET_CHARS = 100_000  # corpus text carried back for the labelling sheet
# a file or stream that breaks (mid-file too): OS, gzip/bz2 (OSError, EOFError), zlib, xz, JSON, pyarrow
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError, pa.ArrowException)


class Stats(Counter):
    """Counters plus a few example ids per skip reason (``files:huge`` -> [...])."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.examples: dict[str, list[str]] = {}

    def skip(self, reason: str, ident: str, level: str = "files") -> None:
        self[f"{level}_skipped:{reason}"] += 1
        ex = self.examples.setdefault(f"{level}:{reason}", [])
        if len(ex) < EXAMPLES_PER_REASON:
            ex.append(ident)

    def merge(self, other: dict, examples: dict | None = None) -> None:
        self.update(other)
        for reason, ids in (examples or {}).items():
            ex = self.examples.setdefault(reason, [])
            ex.extend(ids[: max(0, EXAMPLES_PER_REASON - len(ex))])

    def skipped(self, level: str) -> dict[str, int]:
        head = f"{level}_skipped:"
        return {k[len(head):]: v for k, v in sorted(self.items()) if k.startswith(head) and v}


def screen_documents(index: BenchmarkIndex, ids: list[str], docs: list[bytes], stats: Stats | None = None,
                     with_text: bool = True, where: list[Piece] | None = None) -> list[dict]:
    """Verified pairs between the index and these texts (UTF-8 bytes, already checked)."""
    stats = Stats() if stats is None else stats
    cfg = index.config
    t0 = time.perf_counter()
    files = shingle_batch(docs, cfg.ngram)
    fsize = files.sizes
    short = np.flatnonzero(fsize < cfg.ngram)
    for i in short:
        stats.skip("too_short", ids[i], "texts")
    stats["texts_screened"] += len(docs) - len(short)
    stats["bytes"] += sum(len(d) for d in docs)

    # candidates: texts holding enough of an entry's rare shingles (exact for the reporting rule)
    vals, rows = files.values, files.rows()
    maybe = index.keyfilter.maybe(vals)
    cf, ce, rare = expand_matches(index.keys, index.owner, vals[maybe], rows[maybe], min_hits=index.need)
    fz, ez = fsize[cf], index.sizes[ce]
    t = cfg.threshold
    feasible = ((fz >= t * ez - EPS) & (fz <= ez / t + EPS)) | (index.contain_ok[ce] & (fz >= index.contain_need[ce]))
    cf, ce, rare = cf[feasible], ce[feasible], rare[feasible]
    stats["candidates"] += len(cf)
    if len(cf) == 0:
        stats["seconds"] += time.perf_counter() - t0
        return []

    inter = intersections(index.sets, files, cf, ce)
    esize = index.sizes[ce]
    jac = inter / (esize + fsize[cf] - inter)
    con = inter / esize
    by_jaccard = jac >= t - EPS
    by_containment = index.contain_ok[ce] & (con >= cfg.containment - EPS)
    keep = by_jaccard | by_containment
    cf, ce, jac, con, inter, rare, by_jaccard = (cf[keep], ce[keep], jac[keep], con[keep], inter[keep], rare[keep],
                                                 by_jaccard[keep])

    out = []
    runs: dict[int, Runs] = {}
    for k in np.argsort(cf, kind="stable").tolist():  # aligned spans: each text tokenized once
        f, e = int(cf[k]), int(ce[k])
        if f not in runs:
            th, starts, _ = token_sequence(docs[f])
            runs[f] = Runs(th, starts)
        cov, first, last = aligned_span(index.tokens(e), runs[f], cfg.span_tokens)
        if not by_jaccard[k] and cov < cfg.span_coverage - EPS:
            stats["rejected_by_span"] += 1  # contained by shingles, but not as a copy: a chance overlap
            continue
        rec = {ENTRY: e, S.CORPUS_ID: ids[f], S.JACCARD: float(jac[k]), S.CONTAINMENT: float(con[k]),
               S.SAMPLE_SHINGLES: int(index.sizes[e]), S.CORPUS_SHINGLES: int(fsize[f]),
               S.SHARED_SHINGLES: int(inter[k]), S.SAMPLE_RARE: int(index.rare[e]), S.SHARED_RARE: int(rare[k]),
               S.SPAN_COVERAGE: cov, "_f": f}
        rec.update(_location(docs[f], runs[f], first, last, where[f] if where else None))
        out.append(rec)

    if out:  # the MinHash estimate beside every reported pair (signatures of reported texts only)
        fs = np.array([r["_f"] for r in out])
        uniq, inv = np.unique(fs, return_inverse=True)
        sigs = index.hasher.signatures(files, uniq)
        est = estimate_jaccard(sigs[inv], index.sigs[[r[ENTRY] for r in out]])
        for r, ej in zip(out, est.tolist()):
            f = r.pop("_f")
            r[S.EST_JACCARD] = ej
            if with_text:
                r[S.CORPUS_TEXT] = docs[f][: MAX_SHEET_CHARS * 4].decode("utf-8", "replace")[:MAX_SHEET_CHARS]
    stats["pairs"] += len(out)
    stats["seconds"] += time.perf_counter() - t0
    return out


def _location(doc: bytes, runs: Runs, first: int, last: int, piece: Piece | None) -> dict:
    """Provenance of a pair: file, record, key, and the lines of the aligned copy: of the file
    where the text's place in it is known, else of the text (a JSON document's string)."""
    if first >= 0:
        a = doc.count(b"\n", 0, int(runs.starts[first])) + 1
        b = doc.count(b"\n", 0, int(runs.starts[last])) + 1
    else:
        a, b = 1, doc.count(b"\n") + 1
    if piece is None:
        return {S.CORPUS_FILE: None, S.CORPUS_RECORD: None, S.CORPUS_KEY: "", S.LINE_START: a, S.LINE_END: b}
    if piece.inline:
        a = b = piece.line
    elif piece.line is not None:
        a, b = a + piece.line - 1, b + piece.line - 1
    return {S.CORPUS_FILE: piece.file, S.CORPUS_RECORD: piece.record, S.CORPUS_KEY: piece.key,
            S.LINE_START: a, S.LINE_END: b}


class BatchScreener:
    """Screens corpus batches of one kind: 'files' (a `path` column of corpus files of any
    format, read by `readers.Reader`), or 'records' (a `content` column and an optional id
    column, e.g. rows of a dataset already in memory). Holds the index; no Ray in here."""

    def __init__(self, index: BenchmarkIndex, kind: str = "files", docs_per_call: int = 512,
                 bytes_per_call: int = 16 << 20):
        if kind not in ("files", "records"):
            raise ValueError(f"unknown corpus kind {kind!r}")
        cfg = index.config
        self.index, self.kind, self.docs_per_call, self.bytes_per_call = index, kind, docs_per_call, bytes_per_call
        self.reader = Reader(cfg.max_file_bytes, cfg.max_parse_bytes, cfg.min_text_bytes, cfg.columns)

    def __call__(self, batch: dict) -> tuple[list[dict], Stats]:
        stats = Stats()
        pairs: list[dict] = []
        pieces: list[Piece] = []
        held = [0]  # bytes waiting: memory per call is bounded by docs_per_call and bytes_per_call

        def flush():
            if pieces:
                pairs.extend(screen_documents(self.index, [p.ident for p in pieces], [p.data for p in pieces],
                                              stats, where=pieces))
                pieces.clear()
                held[0] = 0

        def take(piece: Piece) -> bool:
            if piece.reason:
                stats.skip(piece.reason, piece.ident, "texts")
                return False
            pieces.append(piece)
            held[0] += len(piece.data)
            if len(pieces) >= self.docs_per_call or held[0] >= self.bytes_per_call:
                flush()
            return True

        if self.kind == "files":
            for path in _column(batch, "path"):
                self._file(path, take, stats)
        else:
            self._records(batch, take, stats)
        flush()
        return pairs, stats

    def _file(self, path: str, take, stats: Stats) -> None:
        stats["files_in"] += 1
        texts, reason = 0, None
        try:
            for piece in self.reader.read(path, stats):
                texts += take(piece)
        except Skip as exc:
            reason = exc.reason
        except READ_ERRORS:
            reason = "unreadable"
        if texts:
            stats["files_screened"] += 1
            if reason:  # it broke after some texts were read: those were screened, the rest is counted
                stats["files_truncated"] += 1
                stats.examples.setdefault("files:truncated", []).append(path)
        else:
            stats.skip(reason or "no_text", path)

    def _records(self, batch, take, stats: Stats) -> None:
        contents = _column(batch, "content")
        id_col = next((c for c in ("id", "path", "max_stars_repo_path") if c in batch), None)
        idents = _column(batch, id_col) if id_col else [None] * len(contents)
        for value, ident in zip(contents, idents):
            stats["documents"] += 1
            data, reason = _content_bytes(value, self.index.config.max_file_bytes)
            if ident is None or not str(ident):  # no id column: name the row by its content
                ident = "sha1:" + hashlib.sha1(data or b"").hexdigest()[:16]
            take(Piece(data, reason, str(ident), None, "", 1))


def _content_bytes(value, max_bytes: int) -> tuple[bytes | None, str | None]:
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        return None, "no_content"
    reason = check_bytes(data, max_bytes)
    return (None, reason) if reason else (data, None)


def _column(batch, name: str) -> list:
    col = batch[name]
    return col.tolist() if hasattr(col, "tolist") else list(col)
