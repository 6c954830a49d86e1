"""The corpus stage on one batch: shingle -> MinHash -> LSH probe + containment probe -> exact verify.

Plain Python on batches; `leakray.pipelines.screen` runs `BatchScreener` inside Ray Data.
Every batch returns its verified pairs and simple stats (files in, screened, skipped by reason,
candidates, pairs).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import numpy as np

from leakray.schema import P
from leakray.screen import corpus as C
from leakray.screen.index import EPS, BenchmarkIndex
from leakray.screen.lsh import expand_matches
from leakray.screen.minhash import estimate_jaccard
from leakray.screen.shingle import shingle_batch
from leakray.screen.verify import intersections

# keys of a worker's pair record beyond P's columns
ENTRY = "entry"  # row of the index (driver maps it to benchmark, task_id, field, text)
MAX_SHEET_CHARS = 100_000  # corpus text carried back for the labelling sheet


class Stats(Counter):
    """Counters plus a few example ids per skip reason."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.examples: dict[str, list[str]] = {}

    def skip(self, reason: str, ident: str) -> None:
        self["skipped:" + reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < C.EXAMPLES_PER_REASON:
            ex.append(ident)

    def merge(self, other: dict, examples: dict | None = None) -> None:
        self.update(other)
        for reason, ids in (examples or {}).items():
            ex = self.examples.setdefault(reason, [])
            ex.extend(ids[: max(0, C.EXAMPLES_PER_REASON - len(ex))])


def screen_documents(index: BenchmarkIndex, ids: list[str], docs: list[bytes], stats: Stats | None = None,
                     with_text: bool = True) -> list[dict]:
    """Verified pairs between the index and these documents (UTF-8 bytes, already checked)."""
    stats = Stats() if stats is None else stats
    cfg = index.config
    t0 = time.perf_counter()
    files = shingle_batch(docs, cfg.ngram)
    fsize = files.sizes
    short = np.flatnonzero(fsize == 0)
    for i in short:
        stats.skip("too_short", ids[i])
    stats["screened"] += len(docs) - len(short)
    stats["bytes"] += sum(len(d) for d in docs)

    # Jaccard: only files whose size admits J >= t with some entry get a signature
    lo, hi = index.jaccard_size_range
    signed = np.flatnonzero((fsize >= lo) & (fsize <= hi) & (fsize > 0))
    sigs = index.hasher.signatures(files, signed)
    stats["signed"] += len(signed)
    q, e = index.bands.probe(sigs)
    jf, je = signed[q], e
    t = cfg.threshold
    ok = (fsize[jf] >= t * index.sizes[je] - EPS) & (fsize[jf] <= index.sizes[je] / t + EPS)
    jf, je = jf[ok], je[ok]
    stats["candidates_jaccard"] += len(jf)

    # containment: any shingle in an entry's rare prefix makes a candidate
    cf = ce = np.empty(0, np.int64)
    if len(index.prefix_keys):
        big = np.flatnonzero(fsize >= index.contain_min_size)
        if len(big):
            sub_sizes = fsize[big]
            vals = np.concatenate([files[i] for i in big])
            cf, ce = expand_matches(index.prefix_keys, index.prefix_owner, vals, np.repeat(big, sub_sizes),
                                    min_hits=index.prefix_need)
            need = np.ceil(cfg.containment * index.sizes[ce] - EPS)
            keep = fsize[cf] >= need
            cf, ce = cf[keep], ce[keep]
    stats["candidates_containment"] += len(cf)

    if len(jf) + len(cf) == 0:
        stats["seconds"] += time.perf_counter() - t0
        return []
    width = index.n
    pair = np.unique(np.concatenate([jf * width + je, cf * width + ce]))
    pf, pe = pair // width, pair % width
    inter = intersections(index.sets, files, pf, pe)
    esize = index.sizes[pe]
    jac = inter / (esize + fsize[pf] - inter)
    con = inter / esize
    keep = (jac >= t - EPS) | (index.contain_ok[pe] & (con >= cfg.containment - EPS))
    pf, pe, jac, con, inter = pf[keep], pe[keep], jac[keep], con[keep], inter[keep]
    # estimated Jaccard for every reported pair (signatures of files not signed yet, on demand)
    est = np.zeros(len(pf))
    if len(pf):
        need_sig = np.setdiff1d(np.unique(pf), signed)
        all_rows = np.concatenate([signed, need_sig])
        all_sigs = np.concatenate([sigs, index.hasher.signatures(files, need_sig)]) if len(need_sig) else sigs
        order = np.argsort(all_rows)
        where = order[np.searchsorted(all_rows[order], pf)]
        est = estimate_jaccard(all_sigs[where], index.sigs[pe])
    stats["pairs"] += len(pf)
    out = []
    for f, e_, ej, j, c, n in zip(pf.tolist(), pe.tolist(), est.tolist(), jac.tolist(), con.tolist(),
                                  inter.tolist()):
        rec = {ENTRY: e_, P.CORPUS_ID: ids[f], P.EST_JACCARD: ej, P.JACCARD: j, P.CONTAINMENT: c,
               P.SAMPLE_SHINGLES: int(index.sizes[e_]), P.CORPUS_SHINGLES: int(fsize[f]), P.SHARED_SHINGLES: n}
        if with_text:
            rec[P.CORPUS_TEXT] = docs[f][: MAX_SHEET_CHARS * 4].decode("utf-8", "replace")[:MAX_SHEET_CHARS]
        out.append(rec)
    stats["seconds"] += time.perf_counter() - t0
    return out


class BatchScreener:
    """Screens corpus batches of one kind: 'files' (a `path` column of source files), 'jsonl' /
    'parquet' (a `path` column of shards, streamed), 'records' (`content` plus an id column).
    Holds the index; no Ray in here."""

    def __init__(self, index: BenchmarkIndex, kind: str, docs_per_call: int = 512, bytes_per_call: int = 16 << 20):
        if kind not in ("files", "jsonl", "parquet", "records"):
            raise ValueError(f"unknown corpus kind {kind!r}")
        self.index, self.kind, self.docs_per_call, self.bytes_per_call = index, kind, docs_per_call, bytes_per_call
        self.max_bytes = index.config.max_file_bytes

    def __call__(self, batch: dict) -> tuple[list[dict], Stats]:
        stats = Stats()
        pairs: list[dict] = []
        ids: list[str] = []
        docs: list[bytes] = []
        held = [0]  # bytes waiting: memory per call is bounded by docs_per_call and bytes_per_call

        def flush():
            if docs:
                pairs.extend(screen_documents(self.index, ids, docs, stats))
                ids.clear()
                docs.clear()
                held[0] = 0

        def take(ident, data, reason):
            stats["files_in"] += 1
            if reason:
                stats.skip(reason, ident)
                return
            ids.append(ident)
            docs.append(data)
            held[0] += len(data)
            if len(docs) >= self.docs_per_call or held[0] >= self.bytes_per_call:
                flush()

        if self.kind == "files":
            for path in _column(batch, "path"):
                take(path, *C.read_source_file(path, self.max_bytes))
        elif self.kind == "jsonl":
            for path in _column(batch, "path"):
                for ident, data, reason in C.iter_jsonl_documents(path, self.max_bytes):
                    take(ident, data, reason)
        elif self.kind == "parquet":
            for path in _column(batch, "path"):
                cols, reason = C.parquet_columns(path)
                if reason:
                    take(path, None, reason)
                    continue
                try:
                    import pyarrow.parquet as pq

                    for rb in pq.ParquetFile(path).iter_batches(batch_size=self.docs_per_call, columns=cols):
                        self._records(rb.to_pydict(), take)
                except Exception:  # a shard that breaks mid-read: count it, keep what was screened
                    take(path, None, "unreadable")
        else:
            self._records(batch, take)
        flush()
        return pairs, stats

    def _records(self, batch, take) -> None:
        contents = _column(batch, C.CONTENT)
        id_col = next((c for c in C.ID_COLUMNS if c in batch), None)
        idents = _column(batch, id_col) if id_col else [None] * len(contents)
        for value, ident in zip(contents, idents):
            data, reason = C.content_bytes(value, self.max_bytes)
            if ident is None or not str(ident):  # no id column: name the row by its content
                ident = "sha1:" + hashlib.sha1(data or b"").hexdigest()[:16]
            take(str(ident), data, reason)


def _column(batch, name: str) -> list:
    col = batch[name]
    return col.tolist() if hasattr(col, "tolist") else list(col)
