"""The corpus stage on one batch: read -> shingle -> candidates by rare shingles (or by token runs,
in the few texts holding a run's first shingle) -> exact verify -> aligned span check
(containment) -> pairs with provenance.

Plain Python on batches; `leakray.executor.screen` runs `BatchScreener` inside Ray Data.
Every batch returns its verified pairs and counters: files (in, screened, skipped by reason),
documents (a file, or a record of a shard), texts (screened, skipped by reason), candidates, pairs.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import numpy as np

from leakray.screen.candidates import expand_matches
from leakray.screen.corpus import EXAMPLES_PER_REASON
from leakray.schema import P
from leakray.screen.index import EPS, BenchmarkIndex
from leakray.screen.minhash import estimate_jaccard
from leakray.screen.readers import READ_ERRORS, Piece, Reader, Skip, check_bytes
from leakray.screen.shingle import ShingleSets, TextGrams, token_sequence
from leakray.screen.verify import Runs, aligned_span, intersections

# keys of a worker's pair record beyond the P columns
ENTRY = "entry"  # row of the index (driver maps it to benchmark, task_id, part, text)
MAX_SHEET_CHARS = 100_000  # corpus text carried back for the labelling sheet


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
    grams = TextGrams(docs, cfg.ngram)
    short = np.flatnonzero(grams.distinct_floor(np.arange(len(docs)), cfg.ngram - 1) < cfg.ngram)
    for i in short:
        stats.skip("too_short", ids[i], "texts")
    stats["texts_screened"] += len(docs) - len(short)
    stats["bytes"] += sum(len(d) for d in docs)

    # candidates by rare shingles: exact for the reporting rule (index.py says why); the key
    # filter reads the n-grams as they come, unsorted (a repeated key counts once)
    values, rows = grams.select(index.keyfilter.maybe)
    cf, ce, shared = expand_matches(index.lookup, index.owner, values, rows, min_hits=index.need)
    tokens: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # each text tokenized at most once
    rf = re_ = runs = np.empty(0, np.int64)
    if index.runs is not None:  # candidates by token runs, in the texts holding a run's first shingle
        runs_rows, runs_values = [], []
        for f in np.unique(rows[index.runs.starts_in(values)]).tolist():
            tokens[f] = token_sequence(docs[f])
            found = index.runs.found(tokens[f][0])
            runs_rows.append(np.full(len(found), f, dtype=np.int64))
            runs_values.append(found)
        if runs_rows:
            rf, re_, runs = expand_matches(index.runs.keys, index.runs.owner, np.concatenate(runs_values),
                                           np.concatenate(runs_rows), min_hits=index.need_runs)

    cand, files, fsize = _candidate_sets(grams, index, cf, ce, shared, rf)
    fz, ez = fsize[cf], index.sizes[ce]
    t = cfg.threshold
    jac_ok = (shared >= index.need_jaccard[ce]) & (fz >= t * ez - EPS) & (fz <= ez / t + EPS)
    con_ok = (shared >= index.need_contain[ce]) & (fz >= index.contain_need[ce])
    keep = jac_ok | con_ok
    cf, ce, shared, jac_ok, con_ok = cf[keep], ce[keep], shared[keep], jac_ok[keep], con_ok[keep]
    n_rare = len(cf)
    if len(rf):  # runs are containment evidence
        ok = fsize[rf] >= index.contain_need[re_]
        rf, re_, runs = rf[ok], re_[ok], runs[ok]
        cf, ce, shared = np.concatenate([cf, rf]), np.concatenate([ce, re_]), np.concatenate([shared, runs])
        jac_ok = np.concatenate([jac_ok, np.zeros(len(rf), bool)])
        con_ok = np.concatenate([con_ok, np.ones(len(rf), bool)])
    stats["candidates"] += len(cf)
    if len(cf) == 0:
        stats["seconds"] += time.perf_counter() - t0
        return []

    inter = intersections(index.sets, files, np.searchsorted(cand, cf), ce)
    esize = index.sizes[ce]
    jac = inter / (esize + fsize[cf] - inter)
    con = inter / esize
    by_jaccard = jac_ok & (jac >= t - EPS)
    by_containment = con_ok & (con >= cfg.containment - EPS)
    keep = np.flatnonzero(by_jaccard | by_containment)

    out = []
    runs_of: dict[int, Runs] = {}
    for k in keep[np.argsort(cf[keep], kind="stable")].tolist():  # aligned spans: each text tokenized once
        f, e = int(cf[k]), int(ce[k])
        if f not in runs_of:
            runs_of[f] = Runs(*(tokens.get(f) or token_sequence(docs[f])))
        by_runs = k >= n_rare  # evidence by runs of data: aligned in runs of that length
        cov, first, last = aligned_span(index.tokens(e), runs_of[f], index.run_tokens if by_runs else cfg.span_tokens)
        if not by_jaccard[k] and cov < cfg.span_coverage - EPS:
            stats["rejected_by_span"] += 1  # contained by shingles, but not as a copy: a chance overlap
            continue
        rec = {ENTRY: e, P.CORPUS_ID: ids[f], P.JACCARD: float(jac[k]), P.CONTAINMENT: float(con[k]),
               P.MATCHED_BY: "jaccard" if by_jaccard[k] else "runs" if by_runs else "containment",
               P.SAMPLE_SHINGLES: int(index.sizes[e]), P.CORPUS_SHINGLES: int(fsize[f]),
               P.SHARED_SHINGLES: int(inter[k]), P.SAMPLE_RARE: None if by_runs else int(index.rare[e]),
               P.SHARED_RARE: None if by_runs else int(shared[k]),
               P.SAMPLE_RUNS: int(index.n_runs[e]) if by_runs else None,
               P.SHARED_RUNS: int(shared[k]) if by_runs else None,
               P.SPAN_COVERAGE: cov, "_f": f}
        rec.update(_location(docs[f], runs_of[f], first, last, where[f] if where else None))
        out.append(rec)

    if out:  # the MinHash estimate beside every reported pair (signatures of reported texts only)
        fs = np.array([r["_f"] for r in out])
        uniq, inv = np.unique(fs, return_inverse=True)
        sigs = index.hasher.signatures(files, np.searchsorted(cand, uniq))
        est = estimate_jaccard(sigs[inv], index.sigs[[r[ENTRY] for r in out]])
        for r, ej in zip(out, est.tolist()):
            f = r.pop("_f")
            r[P.EST_JACCARD] = ej
            if with_text:
                r[P.CORPUS_TEXT] = docs[f][: MAX_SHEET_CHARS * 4].decode("utf-8", "replace")[:MAX_SHEET_CHARS]
    stats["pairs"] += len(out)
    stats["seconds"] += time.perf_counter() - t0
    return out


def _candidate_sets(grams: TextGrams, index: BenchmarkIndex, cf: np.ndarray, ce: np.ndarray, shared: np.ndarray,
                    rf: np.ndarray) -> tuple[np.ndarray, ShingleSets, np.ndarray]:
    """(rows, sets, fsize): the candidate texts that need their sorted distinct shingles (`sets`,
    in the order of `rows`), and the distinct count of every candidate text by batch row: exact
    for those; for the others, above the largest size any of their Jaccard pairs admits.

    Pairs by containment or runs are decided on the sets. A pair that may only pass by Jaccard
    needs fz <= ez / t: a large corpus text that shares a few rare shingles by chance is ruled
    out on a prefix of its n-grams, without sorting them all (most candidates are such texts)."""
    t = index.config.threshold
    exact = np.union1d(cf[shared >= index.need_contain[ce]], rf)
    jac = (shared >= index.need_jaccard[ce]) & ~np.isin(cf, exact)
    jrows, inv = np.unique(cf[jac], return_inverse=True)
    limit = np.zeros(len(jrows), np.int64)  # per text: the largest size its Jaccard pairs admit
    np.maximum.at(limit, inv, np.floor(index.sizes[ce[jac]] / t + EPS).astype(np.int64))
    fsize = np.zeros(len(grams), np.int64)
    fsize[jrows] = grams.distinct_floor(jrows, limit)
    rows = np.union1d(exact, jrows[fsize[jrows] <= limit])
    sets = grams.distinct(rows)
    fsize[rows] = sets.sizes
    return rows, sets, fsize


def _location(doc: bytes, runs: Runs, first: int, last: int, piece: Piece | None) -> dict:
    """Provenance of a pair: file, record, key, and the lines of the aligned copy: of the file
    where the text's place in it is known, else of the text (a JSON document's string)."""
    if first >= 0:
        a = doc.count(b"\n", 0, int(runs.starts[first])) + 1
        b = doc.count(b"\n", 0, int(runs.starts[last])) + 1
    else:
        a, b = 1, doc.count(b"\n") + 1
    if piece is None:
        return {P.CORPUS_FILE: None, P.CORPUS_RECORD: None, P.CORPUS_KEY: "", P.LINE_START: a, P.LINE_END: b}
    if piece.inline:
        a = b = piece.line
    elif piece.line is not None:
        a, b = a + piece.line - 1, b + piece.line - 1
    return {P.CORPUS_FILE: piece.file, P.CORPUS_RECORD: piece.record, P.CORPUS_KEY: piece.key,
            P.LINE_START: a, P.LINE_END: b}


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
