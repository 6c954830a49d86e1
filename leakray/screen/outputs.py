"""Run-directory outputs of a screen: pairs.parquet, summary.json, labels.csv, clean/<name>/<file>, _SUCCESS.

summary.json::

    {"benchmarks": {NAME: {"n_samples", "n_leaked", "ratio", "n_pairs", "n_unscreenable",
                           "leaked_task_ids", "path", "clean_export"}},
     "corpus": {"files_in", "screened", "skipped": {reason: n}, "skipped_examples": {...}, ...},
     "config": {threshold, ngram, num_perm, seed, bands, rows, containment, ...},
     "run_key": ..., "seconds": ...}
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
from leakray.schema import P, T

MARKER = "_SUCCESS"
PAIRS = "pairs.parquet"
SUMMARY = "summary.json"
SHEET = "labels.csv"
CLEAN = "clean"
LABELS = ("exact_copy", "semantically_equivalent", "related_not_duplicate", "unrelated")  # LessLeak's four classes
SHEET_PAIRS_PER_SAMPLE = 5

PAIRS_SCHEMA = pa.schema([
    (P.BENCHMARK, pa.string()), (P.TASK_ID, pa.string()), (P.FIELD, pa.string()), (P.CORPUS_ID, pa.string()),
    (P.EST_JACCARD, pa.float64()), (P.JACCARD, pa.float64()), (P.CONTAINMENT, pa.float64()),
    (P.SAMPLE_SHINGLES, pa.int64()), (P.CORPUS_SHINGLES, pa.int64()), (P.SHARED_SHINGLES, pa.int64()),
])


class Entries:
    """The screened texts, in index order: (benchmark, task_id, field, text, source_row)."""

    def __init__(self):
        self.benchmark: list[str] = []
        self.task_id: list[str] = []
        self.field: list[str] = []
        self.text: list[str] = []
        self.source_row: list[int | None] = []

    def __len__(self) -> int:
        return len(self.text)

    @classmethod
    def from_tasks(cls, tasks_by_benchmark: dict[str, list[dict]], field: str) -> Entries:
        fields = ("reference", "prompt") if field == "both" else (field,)
        col = {"reference": T.REFERENCE, "prompt": T.PROMPT}
        out = cls()
        for name, tasks in tasks_by_benchmark.items():
            for task in tasks:
                meta = json.loads(task.get(T.META) or "{}")
                for f in fields:
                    out.benchmark.append(name)
                    out.task_id.append(task[T.TASK_ID])
                    out.field.append(f)
                    out.text.append(task[col[f]])
                    out.source_row.append(meta.get("source_row"))
        return out


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
        rows.append({P.BENCHMARK: entries.benchmark[e], P.TASK_ID: entries.task_id[e], P.FIELD: entries.field[e],
                     **{k: p[k] for k in PAIRS_SCHEMA.names if k in p}, "_entry": e,
                     "_text": p.get(P.CORPUS_TEXT, "")})
    rows.sort(key=lambda r: (r[P.BENCHMARK], r[P.TASK_ID], r[P.FIELD], -r[P.JACCARD], -r[P.CONTAINMENT],
                             r[P.CORPUS_ID]))
    table = pa.Table.from_pylist([{k: r[k] for k in PAIRS_SCHEMA.names} for r in rows], schema=PAIRS_SCHEMA)
    _atomic_write(out / PAIRS, lambda p: pq.write_table(table, p))

    # labelling sheet: the best few pairs per sample, both texts, an empty label
    per_sample = defaultdict(int)

    def write_sheet(path):
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow([P.BENCHMARK, P.TASK_ID, P.FIELD, P.CORPUS_ID, P.JACCARD, P.CONTAINMENT, P.EST_JACCARD,
                        P.SAMPLE_TEXT, P.CORPUS_TEXT, P.LABEL])
            for r in rows:
                k = (r[P.BENCHMARK], r[P.TASK_ID], r[P.FIELD])
                per_sample[k] += 1
                if per_sample[k] > SHEET_PAIRS_PER_SAMPLE:
                    continue
                w.writerow([r[P.BENCHMARK], r[P.TASK_ID], r[P.FIELD], r[P.CORPUS_ID], f"{r[P.JACCARD]:.4f}",
                            f"{r[P.CONTAINMENT]:.4f}", f"{r[P.EST_JACCARD]:.4f}", entries.text[r['_entry']],
                            r["_text"], ""])

    _atomic_write(out / SHEET, write_sheet)

    leaked: dict[str, set[str]] = defaultdict(set)
    leaked_rows: dict[str, set] = defaultdict(set)
    n_pairs: dict[str, int] = defaultdict(int)
    for r in rows:
        leaked[r[P.BENCHMARK]].add(r[P.TASK_ID])
        leaked_rows[r[P.BENCHMARK]].add(entries.source_row[r["_entry"]])
        n_pairs[r[P.BENCHMARK]] += 1
    unscreenable = defaultdict(set)
    for e, ok in enumerate(screenable):
        if not ok:
            unscreenable[entries.benchmark[e]].add(entries.task_id[e])

    per_bench = {}
    for name, path in benchmarks:
        n = n_tasks[name]
        clean_export, clean_error = None, None
        if None in leaked_rows[name]:
            clean_error = "the reader recorded no source_row for a flagged task"
        else:
            try:  # never lose a finished pass to an export problem (e.g. a format added to the readers later)
                clean_export = str(export_clean(path, out / CLEAN / name, leaked_rows[name]).relative_to(out))
            except (BadInput, OSError, ValueError) as exc:
                clean_error = str(exc)
        per_bench[name] = {
            "n_samples": n, "n_leaked": len(leaked[name]),
            "ratio": (len(leaked[name]) / n) if n else 0.0, "n_pairs": n_pairs[name],
            "n_unscreenable": len(unscreenable[name]), "leaked_task_ids": sorted(leaked[name]),
            "path": str(path), "clean_export": clean_export,
        }
        if clean_error:
            per_bench[name]["clean_export_error"] = clean_error
    summary = {"benchmarks": per_bench, "corpus": corpus_stats, "config": config_record,
               "run_key": key, "seconds": round(seconds, 3),
               "outputs": {"pairs": PAIRS, "sheet": SHEET, "clean": CLEAN, "labels": list(LABELS)}}
    _atomic_write(out / SUMMARY, lambda p: p.write_text(json.dumps(summary, indent=2, sort_keys=True)))
    marker.write_text(json.dumps({"run_key": key, "config_digest": config_record.get("digest")}))
    return summary


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
