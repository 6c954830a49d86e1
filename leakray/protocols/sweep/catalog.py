"""The sweep history: one SQLite file (stdlib sqlite3) per sweep output dir.

`sweep_runs`: one row per `leakray sweep` invocation. `results`: one row per
(time, sweep, model, benchmark, detector) with the median metrics, the cell's run dir and
the target tasks the detector flagged. A cell is written in one transaction, and only when
its latest row for that (sweep, model, benchmark, detector) came from another run dir or
code version, so a re-run (or a resumed kill) never duplicates rows, and a cell that goes
back to an earlier config still gets a row saying so.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from leakray.errors import BadInput
from leakray.schema import S

FILE = "catalog.sqlite"
METRICS = ("auc", "tpr_at_5fpr", "precision", "recall", "mcc")
SCHEMA = """
CREATE TABLE IF NOT EXISTS sweep_runs (
  id TEXT PRIMARY KEY, sweep TEXT NOT NULL, started TEXT NOT NULL, finished TEXT,
  code_version TEXT NOT NULL, git_commit TEXT, spec TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
  id INTEGER PRIMARY KEY, time TEXT NOT NULL, sweep_run TEXT NOT NULL REFERENCES sweep_runs(id),
  sweep TEXT NOT NULL, model TEXT NOT NULL, benchmark TEXT NOT NULL, detector TEXT NOT NULL,
  auc REAL, tpr_at_5fpr REAL, precision REAL, recall REAL, mcc REAL, n INTEGER,
  n_flagged INTEGER NOT NULL, flagged TEXT NOT NULL, run_dir TEXT NOT NULL, code_version TEXT NOT NULL,
  UNIQUE (sweep_run, sweep, model, benchmark, detector));
CREATE INDEX IF NOT EXISTS results_cell ON results (sweep, model, benchmark, detector, time);
"""


def now() -> str:
    """UTC, microseconds: sorts as text, and two rows of one cell never tie."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def connect(path: str | Path, create: bool = True) -> sqlite3.Connection:
    path = Path(path)
    if not create and not path.exists():
        raise BadInput("no sweep catalog here (run `leakray sweep SWEEP.yaml` first, or pass --catalog)",
                       path=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE), so a cell's rows land together
    con = sqlite3.connect(path, timeout=60, isolation_level=None)
    con.row_factory = sqlite3.Row
    con.executescript(SCHEMA)
    return con


def start_run(con: sqlite3.Connection, sweep: str, code_version: str, git_commit: str | None, spec: dict) -> str:
    started = now()
    run = started.replace(":", "").replace("-", "")[:22]  # 20250101T120000.123456 -> sortable, shell-safe
    con.execute("INSERT INTO sweep_runs VALUES (?, ?, ?, NULL, ?, ?, ?, 'running')",
                (run, sweep, started, code_version, git_commit, json.dumps(spec, sort_keys=True)))
    return run


def finish_run(con: sqlite3.Connection, run: str, status: str) -> None:
    con.execute("UPDATE sweep_runs SET finished = ?, status = ? WHERE id = ?", (now(), status, run))


def flagged_tasks(scores_path: Path) -> dict[str, list[str]]:
    """Per detector, the target tasks predicted member by its shadow-chosen threshold: by more
    than half of its seeds (seed-free detectors have one)."""
    t = pq.read_table(scores_path, columns=[S.TASK_ID, S.DETECTOR, S.PREDICTION])
    out: dict[str, list[str]] = {}
    for det in sorted(set(t.column(S.DETECTOR).to_pylist())):
        rows = t.filter(pc.equal(t[S.DETECTOR], det))
        votes: dict[str, list[int]] = {}
        for task, pred in zip(rows[S.TASK_ID].to_pylist(), rows[S.PREDICTION].to_pylist()):
            votes.setdefault(task, []).append(pred)
        out[det] = sorted(task for task, v in votes.items() if 2 * sum(v) > len(v))
    return out


def cell_rows(run_dir: Path) -> list[dict]:
    """One dict per detector of a finished cell, from its report.json and detect/scores.parquet."""
    report = json.loads((run_dir / "report.json").read_text())
    flagged = flagged_tasks(run_dir / "detect" / "scores.parquet")
    rows = []
    for det, m in sorted(report["detectors"].items()):
        n = None if m.get("n_pos") is None or m.get("n_neg") is None else int(m["n_pos"]) + int(m["n_neg"])
        ids = flagged.get(det, [])
        rows.append({"detector": det, **{k: m.get(k) for k in METRICS}, "n": n,
                     "n_flagged": len(ids), "flagged": json.dumps(ids)})
    return rows


def record_cell(con: sqlite3.Connection, run: str, sweep: str, model: str, benchmark: str, run_dir: Path,
                code_version: str, location: str | None = None) -> int:
    """Write a finished cell's rows (one per detector) unless already recorded; returns rows written.
    ``location``: where the run lives when not at ``run_dir`` (its URI; ``run_dir`` is then this
    node's copy), so the record is the same whichever node writes it."""
    rows = cell_rows(Path(run_dir))
    run_dir = location or str(Path(run_dir))
    written = 0
    con.execute("BEGIN IMMEDIATE")
    try:
        for r in rows:
            last = con.execute(
                "SELECT run_dir, code_version FROM results WHERE sweep=? AND model=? AND benchmark=? AND detector=? "
                "ORDER BY time DESC LIMIT 1", (sweep, model, benchmark, r["detector"])).fetchone()
            if last is not None and (last["run_dir"], last["code_version"]) == (str(run_dir), code_version):
                continue
            con.execute(
                "INSERT INTO results (time, sweep_run, sweep, model, benchmark, detector, auc, tpr_at_5fpr, precision,"
                " recall, mcc, n, n_flagged, flagged, run_dir, code_version)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (now(), run, sweep, model, benchmark, r["detector"], *(r[k] for k in METRICS), r["n"],
                 r["n_flagged"], r["flagged"], str(run_dir), code_version))
            written += 1
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return written


# ---- reading -------------------------------------------------------------------------------

def history(con: sqlite3.Connection, **where: str | None) -> list[sqlite3.Row]:
    clauses = [(f"{k} = ?", v) for k, v in where.items() if v is not None]
    sql = "SELECT * FROM results" + (" WHERE " + " AND ".join(c for c, _ in clauses) if clauses else "")
    return con.execute(sql + " ORDER BY time, model, benchmark, detector", [v for _, v in clauses]).fetchall()


def cutoff(con: sqlite3.Connection, ref: str) -> str:
    """The time a sweep-run reference stands for: a run id (or unique prefix), `latest`,
    `previous`, or an ISO time (2025-01-01 or 2025-01-01T12:00:00)."""
    runs = con.execute("SELECT id, started, finished FROM sweep_runs ORDER BY started").fetchall()
    if ref in ("latest", "previous"):
        if len(runs) < (1 if ref == "latest" else 2):
            raise BadInput(f"the catalog holds {len(runs)} sweep run(s); {ref!r} does not exist")
        chosen = runs[-1] if ref == "latest" else runs[-2]
    else:
        matches = [r for r in runs if r["id"].startswith(ref)]
        if len(matches) > 1:
            raise BadInput(f"sweep run {ref!r} is ambiguous: {', '.join(r['id'] for r in matches)}")
        if not matches:
            try:
                when = dt.datetime.fromisoformat(ref.removesuffix("Z"))
            except ValueError:
                raise BadInput(f"{ref!r} is neither a sweep run id (see `leakray sweep history --runs`) "
                               "nor an ISO time") from None
            return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        chosen = matches[0]
    if chosen["finished"]:
        return chosen["finished"]
    # a killed run: its last row (or its start)
    last = con.execute("SELECT MAX(time) FROM results WHERE sweep_run = ?", (chosen["id"],)).fetchone()[0]
    return max(filter(None, (last, chosen["started"])))


def state_at(con: sqlite3.Connection, when: str) -> dict[tuple, sqlite3.Row]:
    """Per (sweep, model, benchmark, detector), its latest row at or before `when`."""
    rows = con.execute("SELECT * FROM results WHERE time <= ? ORDER BY time", (when,)).fetchall()
    return {(r["sweep"], r["model"], r["benchmark"], r["detector"]): r for r in rows}


def diff(con: sqlite3.Connection, a: str, b: str) -> list[dict]:
    """Per (sweep, model, benchmark, detector) known at either time: tasks newly flagged at `b`
    and cleared since `a` (a cell present on one side only has `only` set)."""
    before, after = state_at(con, cutoff(con, a)), state_at(con, cutoff(con, b))
    out = []
    for key in sorted(set(before) | set(after)):
        old = set(json.loads(before[key]["flagged"])) if key in before else set()
        new = set(json.loads(after[key]["flagged"])) if key in after else set()
        only = "a" if key not in after else "b" if key not in before else None
        out.append({"sweep": key[0], "model": key[1], "benchmark": key[2], "detector": key[3],
                    "newly_flagged": sorted(new - old), "cleared": sorted(old - new), "only": only,
                    "run_dir_a": before[key]["run_dir"] if key in before else None,
                    "run_dir_b": after[key]["run_dir"] if key in after else None})
    return out


def catalog_path(output_dir: Path) -> Path:
    return Path(output_dir) / FILE

