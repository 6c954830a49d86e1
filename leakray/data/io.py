"""Reading benchmark files: JSONL(.gz), JSON, parquet, each row tagged with where it came from."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from leakray.errors import BadInput


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def jsonl_values(lines: Iterable[str]) -> Iterator[tuple[int, Any, json.JSONDecodeError | None]]:
    """(1-based line number, value, None) for each non-blank JSONL line, or (line number, None,
    the error) for one that is not valid JSON: the caller decides whether that ends the file."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            yield lineno, None, exc
            continue
        yield lineno, value, None


def iter_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield (row number, record) from a JSONL, JSON (list or {id: record}) or parquet file.

    Row numbers are 1-based lines for JSONL and 0-based indices otherwise.
    """
    path = Path(path)
    if not path.exists():
        raise BadInput("file does not exist", path=str(path))
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        with _open_text(path) as fh:
            for lineno, rec, bad in jsonl_values(fh):
                if bad is not None:
                    raise BadInput(f"not valid JSON ({bad.msg})", path=str(path), row=lineno) from bad
                if not isinstance(rec, dict):
                    raise BadInput("a JSON object is expected", path=str(path), row=lineno)
                yield lineno, rec
    elif name.endswith((".json", ".json.gz")):
        with _open_text(path) as fh:
            try:
                data = json.load(fh)
            except json.JSONDecodeError as exc:
                raise BadInput(f"not valid JSON ({exc.msg}, line {exc.lineno})", path=str(path)) from exc
        items = data if isinstance(data, list) else list(data.values()) if isinstance(data, dict) else None
        if items is None:
            raise BadInput("a JSON list or object of records is expected", path=str(path))
        for i, rec in enumerate(items):
            if not isinstance(rec, dict):
                raise BadInput("a JSON object is expected", path=str(path), row=i)
            yield i, rec
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        for i, rec in enumerate(pq.read_table(path).to_pylist()):
            yield i, rec
    else:
        raise BadInput("unknown format (expected .jsonl, .jsonl.gz, .json, .json.gz or .parquet)", path=str(path))


def require(rec: dict, field: str, *, path, row, types=(str,), nonempty: bool = True):
    """Return rec[field], refusing a missing, mistyped or (optionally) empty value."""
    if field not in rec or rec[field] is None:
        raise BadInput("missing", path=str(path), row=row, field=field)
    value = rec[field]
    if not isinstance(value, types):
        raise BadInput(f"expected {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}",
                       path=str(path), row=row, field=field)
    if nonempty and isinstance(value, (str, list)) and not value:
        raise BadInput("empty", path=str(path), row=row, field=field)
    return value
