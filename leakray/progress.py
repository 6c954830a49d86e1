"""A running stage's progress on the console: how many of its rows are written, and about how long
the rest will take.

A collection of a real model on a CPU, or through a rate-limited API, runs for hours, and the
console used to say nothing between the stage's start and its summary line. A stage whose rows
land in part files as they are made (a collection, the AdvPrompt proofs: Ray Data writes each
batch's file when it is done, `executor.batches.write_parts`) says how many rows it will make
(`expect_rows`); while it runs, `StageProgress` counts the distinct task ids in those files now and
then and prints a line when the count moved (or, with no news, every `QUIET_S`, so a stalled stage
is seen as stalled). Rows a killed attempt had finished (`runs.KEPT`) count as done; the time left
is estimated from the rows made by this attempt. A stage whose work is steps rather than rows (a
fine-tune) has its worker write the count itself (`report_steps`); one whose work is jobs that
finish in any order (the detect stage) keeps a `JobTally`. A stage that writes no such
file, or runs on another file system than this one (parts written straight to the run's URI, a
worker on another node), prints no progress.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

# {"total": rows the stage will write} or a worker's {"total", "done", "unit"}, in the stage's
# directory; never mirrored to a run's URI (`storage._skipped`), removed when the stage ends
PROGRESS_FILE = "_progress.json"
EVERY_S = 60.0  # how often the part files are counted
QUIET_S = 300.0  # with no new row, a line this often all the same


def expect_rows(stage_dir: Path, total: int, id_column: str) -> None:
    """Declare that the stage in ``stage_dir`` will write ``total`` rows into part files, one per
    distinct value of ``id_column`` (a retried row is written again: counted once)."""
    path = Path(stage_dir) / PROGRESS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"total": int(total), "id": id_column}))


def report_steps(progress_file: str | Path | None, done: int, total: int, unit: str = "steps",
                 pace: bool = True) -> None:
    """A worker's count of its steps (a fine-tune's optimiser steps), for its stage's progress
    lines; best effort: a file that cannot be written (another node's path) is skipped. ``pace``
    False: the steps differ too much in size for the count to say how long the rest will take."""
    if progress_file is None:
        return
    path = Path(progress_file)
    try:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"total": int(total), "done": int(done), "unit": unit,
                                   **({} if pace else {"pace": False})}))
        tmp.replace(path)
    except OSError:
        pass


class JobTally:
    """The count of a stage whose work is jobs that finish in any order (the detect stage's
    detectors and seeds, as Ray tasks, driver threads and Tune or Train runs): each finished job
    moves the count in the stage's progress file (`report_steps`, unit ``unit``). Jobs are added as
    the stage plans them; thread-safe. The lines say no time left: jobs differ in size by a
    thousand times (the demo's detect stage: 43 of 44 jobs were done after a minute, and the last,
    AdvPrompt's ablation, took another 15 s)."""

    def __init__(self, progress_file: str | Path | None, unit: str = "jobs"):
        self.file, self.unit = progress_file, unit
        self.total = self.done = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.total += int(n)
            self._write()

    def finished(self, n: int = 1) -> None:
        with self._lock:
            self.done += int(n)
            self._write()

    def _write(self) -> None:
        report_steps(self.file, self.done, self.total, self.unit, pace=False)


def _declared(stage_dir: Path) -> dict | None:
    """The stage's progress file: {"total"} (rows counted from its part files) or {"total", "done",
    "unit", "pace"} (a count its worker keeps); None before the stage has written one."""
    try:
        info = json.loads((Path(stage_dir) / PROGRESS_FILE).read_text())
        return {"total": int(info["total"]), **({"done": int(info["done"]), "unit": str(info.get("unit", "steps")),
                                                 "pace": bool(info.get("pace", True))}
                                                if "done" in info else {"id": str(info["id"])})}
    except (OSError, ValueError, KeyError, TypeError):
        return None


class RowCounter:
    """The distinct ids in the part files under a stage directory; a file is read once (its ids
    only), a file still being written is tried again next time."""

    def __init__(self, stage_dir: Path):
        self.dir = Path(stage_dir)
        self._ids: dict[Path, frozenset] = {}

    def files(self) -> set[Path]:
        return set(self.dir.rglob("parts/*.parquet"))

    def refresh(self, id_column: str) -> None:
        """Read the ids of the part files not read yet."""
        import pyarrow.parquet as pq

        for path in self.files():
            if path not in self._ids:
                try:
                    self._ids[path] = frozenset(pq.read_table(path, columns=[id_column]).column(0).to_pylist())
                except Exception:  # half written, or not a per-task file: not counted (yet)
                    continue

    def distinct(self, among: set[Path] | None = None) -> int:
        """Distinct ids in the files read so far (``among``: in those files only); no I/O."""
        ids = [v for p, v in self._ids.items() if among is None or p in among]
        return len(frozenset().union(*ids)) if ids else 0

    def count(self, id_column: str, among: set[Path] | None = None) -> int:
        """Distinct ids in every part file (``among``: in those files only)."""
        self.refresh(id_column)
        return self.distinct(among)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def progress_line(done: int, total: int, elapsed: float, made: int, unit: str = "tasks") -> str:
    """``done`` of ``total`` rows (or steps) after ``elapsed`` s, ``made`` of them by this attempt."""
    line = f"{done} of {total} {unit} after {_minutes(elapsed)}"
    if 0 < made and done < total:
        line += f"; about {_minutes(elapsed / made * (total - done))} left"
    return line


class StageProgress:
    """``with StageProgress(stage_dir, say): run the stage``: a thread that calls ``say(line)`` now
    and then while the stage runs, once the stage has declared its rows (module doc)."""

    def __init__(self, stage_dir: Path, say, every: float | None = None, quiet: float | None = None):
        self.dir, self.say = Path(stage_dir), say
        self.every = EVERY_S if every is None else every
        self.quiet = QUIET_S if quiet is None else quiet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-progress", daemon=True)

    def __enter__(self) -> "StageProgress":
        # the part files a killed attempt left (`runs.KEPT`): their rows are done, but not by this
        # attempt, so they do not count towards its pace
        self._counter = RowCounter(self.dir)
        self._earlier, self._t0 = self._counter.files(), time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        counter, t0, last = self._counter, self._t0, None  # last: rows at the last line
        last_said = t0
        while not self._stop.wait(self.every):
            declared = _declared(self.dir)
            if declared is None:
                continue
            total = declared["total"]
            if "done" in declared:  # a worker's own count of its steps, from the stage's start
                # (steps of very different sizes give no pace: made 0, no time left said)
                done, unit = declared["done"], declared["unit"]
                made = done if declared["pace"] else 0
            else:
                counter.refresh(declared["id"])  # one pass over the files for both counts
                done = counter.distinct()
                made, unit = done - counter.distinct(self._earlier), "tasks"
            now = time.monotonic()
            if done != last or now - last_said >= self.quiet:
                try:
                    self.say(progress_line(min(done, total), total, now - t0, made, unit))
                except Exception:  # a console that cannot print must not stop the stage
                    return
                last, last_said = done, now
