"""Run-directory outputs of a screen: pairs.parquet, summary.json, labels.csv, clean/<name>/<file>, _SUCCESS.

summary.json::

    {"benchmarks": {NAME: {"n_samples", "n_leaked", "ratio", "n_pairs", "n_unscreenable",
                           "parts": {PART: {"n_screenable", "n_leaked", "ratio"}},
                           "documents_per_task": {task_id: n}, "leaked_task_ids", "path", "clean_export"}},
     "corpus": {"files": {"in", "screened", "skipped": {reason: n}, "truncated", "formats"},
                "documents": n, "texts": {"screened", "skipped": {reason: n}}, "skipped_examples", ...},
     "config": {threshold, containment, ngram, parts, span_tokens, span_coverage, ...},
     "run_key": ..., "seconds": ...}

``ratio`` is LessLeak's leakage ratio: leaked samples / samples, a sample being leaked when any
of its screened parts has a pair; per part, the same over that part's pairs. A document is a
corpus file, or one record of a JSONL / JSON array / parquet / Arrow shard; documents_per_task
counts the distinct documents holding a copy of some part of the task.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from leakray.data.io import iter_records
from leakray.errors import BadInput
from leakray.runs import file_digest
from leakray.schema import P
from leakray.screen.parts import PARTS, Entries

MARKER = "_SUCCESS"
PAIRS = "pairs.parquet"
SUMMARY = "summary.json"
SHEET = "labels.csv"
CLEAN = "clean"
LABELS = ("exact_copy", "semantically_equivalent", "related_not_duplicate", "unrelated")  # LessLeak's four classes
SHEET_PAIRS_PER_SAMPLE = 5

PAIRS_SCHEMA = pa.schema([
    (P.BENCHMARK, pa.string()), (P.TASK_ID, pa.string()), (P.PART, pa.string()), (P.CORPUS_ID, pa.string()),
    (P.CORPUS_FILE, pa.string()), (P.CORPUS_RECORD, pa.int64()), (P.CORPUS_KEY, pa.string()),
    (P.LINE_START, pa.int64()), (P.LINE_END, pa.int64()),
    (P.EST_JACCARD, pa.float64()), (P.JACCARD, pa.float64()), (P.CONTAINMENT, pa.float64()),
    (P.MATCHED_BY, pa.string()), (P.SPAN_COVERAGE, pa.float64()),
    (P.SAMPLE_SHINGLES, pa.int64()), (P.CORPUS_SHINGLES, pa.int64()), (P.SHARED_SHINGLES, pa.int64()),
    (P.SAMPLE_RARE, pa.int64()), (P.SHARED_RARE, pa.int64()), (P.SAMPLE_RUNS, pa.int64()), (P.SHARED_RUNS, pa.int64()),
])


def run_key(config_digest: str, benchmarks: list[tuple[str, str]], corpus_fingerprint: list) -> str:
    h = hashlib.sha256()
    h.update(config_digest.encode())
    for name, path in benchmarks:
        h.update(f"{name}\0{file_digest(path)}\0".encode())
    h.update(json.dumps(corpus_fingerprint).encode())
    return h.hexdigest()[:24]


def finished(out_dir: str | Path, key: str) -> bool:
    marker = Path(out_dir) / MARKER
    try:
        return json.loads(marker.read_text()).get("run_key") == key
    except (OSError, ValueError):
        return False


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_outputs(out_dir: str | Path, *, key: str, entries: Entries, pairs: list[dict],
                  benchmarks: list[tuple[str, str]], n_tasks: dict[str, int], corpus_stats: dict,
                  config_record: dict, seconds: float, screenable=()) -> dict:
    """Write every output, the marker last. `pairs` are worker records (entry index + P columns)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    marker = out / MARKER
    if marker.exists():
        marker.unlink()
    rows = []
    for p in pairs:
        e = p["entry"]
        rows.append({**{k: p.get(k) for k in PAIRS_SCHEMA.names}, P.BENCHMARK: entries.benchmark[e],
                     P.TASK_ID: entries.task_id[e], P.PART: entries.field[e], "_entry": e,
                     "_text": p.get(P.CORPUS_TEXT, "")})
    rows.sort(key=lambda r: (r[P.BENCHMARK], r[P.TASK_ID], _part_order(r[P.PART]), -r[P.JACCARD],
                             -r[P.CONTAINMENT], r[P.CORPUS_ID]))
    table = pa.Table.from_pylist([{k: r[k] for k in PAIRS_SCHEMA.names} for r in rows], schema=PAIRS_SCHEMA)
    _atomic_write(out / PAIRS, lambda p: pq.write_table(table, p))
    _atomic_write(out / SHEET, lambda p: _write_sheet(p, rows, entries))

    per_bench = {}
    for name, path in benchmarks:
        mine = [r for r in rows if r[P.BENCHMARK] == name]
        leaked = sorted({r[P.TASK_ID] for r in mine})
        n = n_tasks[name]
        docs: dict[str, set] = defaultdict(set)
        for r in mine:
            docs[r[P.TASK_ID]].add((r[P.CORPUS_FILE] or r[P.CORPUS_ID], r[P.CORPUS_RECORD]))
        parts = {}
        for part in PARTS:
            ok = {entries.task_id[e] for e, good in enumerate(screenable)
                  if good and entries.benchmark[e] == name and entries.field[e] == part}
            hit = {r[P.TASK_ID] for r in mine if r[P.PART] == part}
            if ok or hit:
                parts[part] = {"n_screenable": len(ok), "n_leaked": len(hit), "ratio": len(hit) / n if n else 0.0}
        some_part = {entries.task_id[e] for e, good in enumerate(screenable) if good and entries.benchmark[e] == name}
        per_bench[name] = {
            "n_samples": n, "n_leaked": len(leaked), "ratio": len(leaked) / n if n else 0.0, "n_pairs": len(mine),
            "n_unscreenable": n - len(some_part) if len(screenable) else 0, "parts": parts,
            "documents_per_task": {t: len(d) for t, d in sorted(docs.items())}, "leaked_task_ids": leaked,
            "path": str(path),
            **_clean(path, out / CLEAN / name, {entries.source_row[r["_entry"]] for r in mine}, out),
        }
    summary = {"benchmarks": per_bench, "corpus": corpus_stats, "config": config_record,
               "run_key": key, "seconds": round(seconds, 3), "warnings": warnings(corpus_stats),
               "outputs": {"pairs": PAIRS, "sheet": SHEET, "clean": CLEAN, "labels": list(LABELS)}}
    _atomic_write(out / SUMMARY, lambda p: p.write_text(json.dumps(summary, indent=2, sort_keys=True)))
    marker.write_text(json.dumps({"run_key": key, "config_digest": config_record.get("digest")}))
    return summary


NO_TEXT = "no corpus text was screened, so these ratios say nothing about leakage"


def warnings(corpus_stats: dict) -> list[str]:
    """What makes a finished screen's numbers mean less than they say (summary.json's `warnings`,
    the console's last line): files that were read but gave no text (unreadable at read time,
    records without text)."""
    return [] if (corpus_stats.get("texts") or {}).get("screened") else [NO_TEXT]


def _part_order(part: str) -> int:
    return PARTS.index(part) if part in PARTS else len(PARTS)


def _write_sheet(path, rows: list[dict], entries: Entries) -> None:
    """The labelling sheet: the best few pairs per sample part, both texts, an empty label."""
    per_sample: dict[tuple, int] = defaultdict(int)
    cols = [P.BENCHMARK, P.TASK_ID, P.PART, P.CORPUS_ID, P.LINE_START, P.LINE_END, P.MATCHED_BY, P.JACCARD,
            P.CONTAINMENT, P.SPAN_COVERAGE, P.EST_JACCARD, P.SAMPLE_TEXT, P.CORPUS_TEXT, P.LABEL]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            k = (r[P.BENCHMARK], r[P.TASK_ID], r[P.PART])
            per_sample[k] += 1
            if per_sample[k] > SHEET_PAIRS_PER_SAMPLE:
                continue
            w.writerow([r[P.BENCHMARK], r[P.TASK_ID], r[P.PART], r[P.CORPUS_ID], r[P.LINE_START], r[P.LINE_END],
                        r[P.MATCHED_BY], f"{r[P.JACCARD]:.4f}", f"{r[P.CONTAINMENT]:.4f}",
                        f"{r[P.SPAN_COVERAGE] or 0.0:.4f}",
                        f"{r[P.EST_JACCARD] or 0.0:.4f}", entries.text[r['_entry']], r["_text"], ""])


def _clean(path, dest: Path, drop_rows: set, out: Path) -> dict:
    """The clean export's entry in the summary; never lose a finished pass to an export problem
    (e.g. a format added to the readers later)."""
    if None in drop_rows:
        return {"clean_export": None, "clean_export_error": "the reader recorded no source_row for a flagged task"}
    try:
        return {"clean_export": str(export_clean(path, dest, drop_rows).relative_to(out))}
    except (BadInput, OSError, ValueError) as exc:
        return {"clean_export": None, "clean_export_error": str(exc)}


def export_clean(path: str | Path, out_dir: Path, drop_rows: set) -> Path:
    """The benchmark file without the flagged rows, in its own format (jsonl, jsonl.gz, json, parquet)."""
    path = Path(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / path.name
    name = path.name.lower()
    if name.endswith(".parquet"):
        table = pq.read_table(path)
        keep = [i for i in range(table.num_rows) if i not in drop_rows]
        _atomic_write(dest, lambda p: pq.write_table(table.take(pa.array(keep, type=pa.int64())), p))
    elif name.endswith((".jsonl", ".jsonl.gz")):
        def write(p):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(p, "wt", encoding="utf-8") as fh:
                for row, rec in iter_records(path):
                    if row not in drop_rows:
                        fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        _atomic_write(dest, write)
    elif name.endswith((".json", ".json.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
        if isinstance(data, list):
            kept = [rec for i, rec in enumerate(data) if i not in drop_rows]
        elif isinstance(data, dict):
            kept = {k: rec for i, (k, rec) in enumerate(data.items()) if i not in drop_rows}
        else:
            raise BadInput("a JSON list or object of records is expected", path=str(path))

        def write(p):
            with opener(p, "wt", encoding="utf-8") as fh:
                json.dump(kept, fh, ensure_ascii=False, indent=1)
        _atomic_write(dest, write)
    else:
        raise BadInput("cannot export this format", path=str(path))
    return dest
