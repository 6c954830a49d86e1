"""Run directories keyed by a content hash, and per-stage completion markers.

A stage's outputs live in ``<run>/<stage>/``; it is done when ``_DONE.json``
exists there (written last, atomically), so a killed run resumes at the first
stage without a marker and never writes a finished stage twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterable

MARKER = "_DONE.json"
STAGE_KEY = "stage_key"  # a keyed stage's marker records its key: what another run looks it up by
FANOUT_MARK = "fanout.json"  # in a fan-out's parent directory (protocols.fanout): its children are runs
KILL_ENV = "LEAKRAY_KILL_IN_STAGE"  # tests only: see kill_point
# The rows a killed attempt of a stage had finished, for the next attempt of the same stage. A
# resumable stage (`StageSpec.resumable`: a collection, whose rows are a model's answers that cost
# minutes each on a slow host, or an API's money) writes them under `KEPT/<its key>/`, and the next
# attempt of that stage with the same key finds them there (`kept_dir`); `clear_partial` clears the
# rest of the directory, and what another key wrote. Which of the kept files are whole the stage
# decides (a collection reads back the part files that parse, and of their rows those that went
# through). A finished stage keeps none of it (adoption never copies it).
KEPT = "kept"
# Every stage's marker carries these (datatrove-style stats), so reports read them generically.
STAT_DEFAULTS = {"rows_in": None, "rows_out": None, "errors": {}, "parse_failures": {}}


def content_hash(*parts: Any, length: int = 12) -> str:
    """Stable hash of JSON-able parts (configs, file digests); order of dict keys does not matter."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    """Where reusable artifacts (base models, tokenizers) live across runs."""
    root = Path(os.environ.get("LEAKRAY_CACHE", Path.home() / ".cache" / "leakray"))
    root.mkdir(parents=True, exist_ok=True)
    return root


# Set by Ray's job supervisor in the driver of every `ray job submit` job.
_RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def output_root(path: str | Path) -> Path:
    """Where a run writes. A submitted job's working directory is Ray's temporary copy of the
    uploaded tree (deleted with the session), so there a relative path is resolved under
    `$LEAKRAY_HOME` (default `~/leakray`) on the node running the driver instead."""
    path = Path(path).expanduser()
    if path.is_absolute():
        return path
    if os.environ.get(_RAY_JOB_ENV):
        return (Path(os.environ.get("LEAKRAY_HOME", "~/leakray")).expanduser() / path).resolve()
    return path.resolve()


# Linux's whole-machine CPU counters: (busy, idle) CPU-seconds since boot, all CPUs together.
PROC_STAT = "/proc/stat"


def machine_cpu() -> tuple[float, float] | None:
    """(busy, idle) CPU-seconds this machine has spent since boot, every CPU summed (busy: user,
    nice, system, irq, softirq, steal; idle: idle, iowait), or None where /proc/stat is not there.
    Why a stage records them: a stage whose machine stayed busy throughout is bound by its CPUs'
    work, so only less work or more CPUs shortens it; idle CPUs during a stage mean it waited
    (on start-up, I/O, one slow worker) and better scheduling could help (docs/DESIGN.md, "Where
    the time goes on two cores")."""
    try:
        with open(PROC_STAT, encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / hz, (idle + iowait) / hz


def machine_use(before: tuple[float, float] | None, after: tuple[float, float] | None) -> dict | None:
    """The machine's busy and idle CPU-seconds between two `machine_cpu` readings, and the busy
    share. It is the whole machine's (other processes' too) and only the machine this process
    runs on: on a laptop the run's, on a cluster the driver's node."""
    if before is None or after is None:
        return None
    busy, idle = after[0] - before[0], after[1] - before[1]
    if busy < 0 or idle < 0 or busy + idle <= 0:
        return None
    return {"busy_s": round(busy, 2), "idle_s": round(idle, 2), "busy_share": round(busy / (busy + idle), 3),
            "cpus": os.cpu_count()}


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


class Stage:
    """One stage's directory: ``done`` says whether it finished, ``finish`` marks it."""

    def __init__(self, run_dir: Path, name: str):
        self.name = name
        self.dir = Path(run_dir) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()
        self._cpu0 = machine_cpu()

    @property
    def marker(self) -> Path:
        return self.dir / MARKER

    @property
    def done(self) -> bool:
        return self.marker.exists()

    def info(self) -> dict:
        return json.loads(self.marker.read_text()) if self.done else {}

    def start(self) -> "Stage":
        self._t0, self._cpu0 = time.perf_counter(), machine_cpu()
        return self

    def finish(self, **stats: Any) -> dict:
        # "seconds" is the stage's wall time, start to finish: what a run reports as its own
        # (a fine-tune's training loop, not its Ray Train start-up; a collection's steps, not
        # the reference model it built first) is kept beside it as "run_seconds"
        wall = round(time.perf_counter() - self._t0, 2)
        if "seconds" in stats:
            stats["run_seconds"] = stats.pop("seconds")
        info = {"stage": self.name, "seconds": wall, **stats}
        # the machine's CPUs over the stage (stages run `Together` share them: each records the whole machine's)
        use = machine_use(self._cpu0, machine_cpu())
        if use is not None:
            info["machine_cpu"] = use
        write_json_atomic(self.marker, info)
        return info


@dataclass
class StageSpec:
    """One step of a protocol: `run(stage_dir)` writes its outputs there and returns its stats."""

    name: str
    run: Callable[[Path], dict]
    summary: Callable[[dict], str] = lambda info: ""
    # What the stage's outputs depend on, as a content key (the settings it reads, its inputs' keys,
    # the benchmark's content: `protocols.stage_keys`). A finished stage of the same name and key
    # in another run of the same output directory is adopted instead of run again (`StageRunner`),
    # so a run that changes only what later stages read starts where the change starts. None:
    # never adopted (a stage that reads everything, or whose inputs cannot be keyed).
    key: str | None = None
    # a killed attempt's finished rows are read back by the next attempt (`KEPT`; a keyed stage only)
    resumable: bool = False


@dataclass
class Together:
    """Stages that read nothing of each other's, run side by side (one thread each, every one
    waiting on its own Ray work: the target's and the shadow's fine-tunes). Each keeps its own
    marker, so a killed run resumes each on its own."""

    specs: tuple[StageSpec, ...]

    @property
    def name(self) -> str:
        return "+".join(spec.name for spec in self.specs)


def clear_partial(stage_dir: Path, keep: str | None = None) -> None:
    """What a killed attempt of a stage left in its directory (a partial file, half a model)
    is never read back: an unfinished stage starts from an empty directory, except for the rows
    kept under `KEPT/<keep>` (a resumable stage's own key)."""

    def remove(p: Path) -> None:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    for p in Path(stage_dir).iterdir():
        if keep and p.name == KEPT and p.is_dir() and not p.is_symlink():
            for q in p.iterdir():
                if q.name != keep:  # another key's rows: other settings, never this stage's
                    remove(q)
            continue
        remove(p)


def kept_dir(stage_dir: Path) -> Path | None:
    """Where a resumable stage keeps its finished rows in this attempt and finds a killed
    attempt's (`KEPT`): made by the runner before the stage runs; None for a stage that keeps none."""
    kept = Path(stage_dir) / KEPT
    found = [p for p in kept.iterdir() if p.is_dir()] if kept.is_dir() else []
    return found[0] if len(found) == 1 else None


def kill_point(stage: "Stage") -> None:
    """A test hook (tests/test_e2e.py, tests/test_audit.py), a no-op unless $LEAKRAY_KILL_IN_STAGE
    names this stage: then the process leaves a partial output in the stage's directory and dies
    by SIGKILL, as a preempted node would, so a test can resume the run from another process."""
    if os.environ.get(KILL_ENV) != stage.name:
        return
    import signal

    (stage.dir / "partial.tmp").write_text("killed mid-stage\n")
    os.kill(os.getpid(), signal.SIGKILL)


class StageRunner:
    """Owns markers, timings, stats and resumption; a protocol is a list of StageSpecs.

    A stage with a marker is skipped (its recorded info is returned), so a killed run resumes
    at the first unfinished stage and never writes a finished one twice."""

    def __init__(self, run_dir: Path, console, store=None, before_work: Callable[[], None] | None = None,
                 reuse: bool = True):
        """``store``: the run's `storage.RunStore` when it is mirrored to a URI (pushed after each stage).
        ``before_work``: called once, before the first stage that is not done yet (joining the
        cluster the stages run on): an invocation that finds every stage done never calls it.
        ``reuse``: adopt a keyed stage another run of the same output directory finished
        (`StageSpec.key`); False runs every stage this run lacks."""
        self.run_dir, self.console, self.store = Path(run_dir), console, store
        self.reuse = reuse
        self.info: dict[str, dict] = {}
        self.ran: list[str] = []  # the stages this invocation ran (the others were already done)
        self._push_lock = threading.Lock()
        self._before_work, self._ready_lock = before_work, threading.Lock()

    def dir(self, name: str) -> Path:
        return self.run_dir / name

    def run(self, stages: Iterable[StageSpec | Together]) -> dict[str, dict]:
        for spec in stages:
            if isinstance(spec, Together):
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(len(spec.specs)) as pool:
                    infos = list(pool.map(self.run_one, spec.specs))  # the first error is raised here
                self.info.update({s.name: info for s, info in zip(spec.specs, infos)})
            else:
                self.info[spec.name] = self.run_one(spec)
        return self.info

    def run_one(self, spec: StageSpec) -> dict:
        stage = Stage(self.run_dir, spec.name)
        cached = stage.done
        donor = None if cached or not (spec.key and self.reuse) else find_donor(self.run_dir, spec.name, spec.key)
        if donor is not None:  # another run finished this very stage: its outputs, no work
            adopt(donor, stage)
            cached = "reused"
            if self.store is not None:
                with self._push_lock:
                    self.store.push()
        if not cached:
            with self._ready_lock:  # stages run `Together` start at once: one of them calls it
                if self._before_work is not None:
                    self._before_work()
                    self._before_work = None
            keep = spec.key if spec.resumable else None
            clear_partial(stage.dir, keep)
            if keep:
                (stage.dir / KEPT / keep).mkdir(parents=True, exist_ok=True)
            stage.start()
            kill_point(stage)
            stats = {**STAT_DEFAULTS, **(self._run_watched(spec, stage) or {})}
            if spec.key:
                stats[STAGE_KEY] = spec.key
            stage.finish(**stats)
            if keep:  # its rows are in its outputs now
                shutil.rmtree(stage.dir / KEPT, ignore_errors=True)
            self.ran.append(spec.name)
            if self.store is not None:
                with self._push_lock:  # stages run `Together` finish in any order
                    self.store.push()
        info = stage.info()
        summary = spec.summary(info)
        if donor is not None:
            summary = f"{summary} (reused from {donor.parent.name})".lstrip()
        self.console.stage(spec.name, info, summary, cached)
        return info

    def _run_watched(self, spec: StageSpec, stage: "Stage") -> dict | None:
        """The stage's work, with a progress line now and then where it says how many rows it makes
        (`leakray.progress`)."""
        say = getattr(self.console, "progress", None)
        if say is None:
            return spec.run(stage.dir)
        from leakray.progress import PROGRESS_FILE, StageProgress

        try:
            with StageProgress(stage.dir, lambda line: say(spec.name, line)):
                return spec.run(stage.dir)
        finally:
            (stage.dir / PROGRESS_FILE).unlink(missing_ok=True)


def donor_roots(run_dir: Path) -> list[Path]:
    """Where other runs' stages are looked for: the runs beside ``run_dir`` (its output directory);
    for a child of a fan-out (a dose of a dose sweep, one of several benchmarks) also the children
    of every other fan-out in the same output directory (a second dose sweep with other detector
    settings is a new parent directory, and its doses' fine-tunes are the first one's)."""
    parent = Path(run_dir).resolve().parent
    if not (parent / FANOUT_MARK).exists():
        return [parent]
    return [parent, *sorted(p for p in parent.parent.iterdir() if p != parent and (p / FANOUT_MARK).exists())]


def find_donor(run_dir: Path, name: str, key: str) -> Path | None:
    """A finished stage ``name`` with the content key ``key`` in another run of ``donor_roots``,
    or None."""
    run_dir = Path(run_dir).resolve()
    for marker in (m for root in donor_roots(run_dir) for m in sorted(root.glob(f"*/{name}/{MARKER}"))):
        if marker.parent.parent.resolve() == run_dir:
            continue
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):  # a marker being written, or not ours: not a donor
            continue
        if isinstance(info, dict) and info.get(STAGE_KEY) == key:
            return marker.parent
    return None


def adopt(donor: Path, stage: "Stage") -> None:
    """Make ``stage`` the finished ``donor``: its files hard-linked (copied across file systems),
    its marker last, with paths into the donor's run moved to this run and ``reused_from`` added.
    Linking is safe because a finished stage's files are never written again (markers and
    reports are replaced, not rewritten in place); a kill before the marker leaves a partial
    stage that the next attempt clears."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system, or links not allowed
            shutil.copy2(src, dst)

    clear_partial(stage.dir)
    shutil.copytree(donor, stage.dir, symlinks=True, dirs_exist_ok=True, copy_function=link,
                    ignore=shutil.ignore_patterns(MARKER, "partial.tmp", KEPT))
    info = json.loads((donor / MARKER).read_text())
    src, dst = str(donor.parent.resolve()), str(stage.dir.parent.resolve())

    def moved(v: Any) -> Any:
        if isinstance(v, str):
            return dst + v[len(src):] if v == src or v.startswith(src + os.sep) else v
        if isinstance(v, list):
            return [moved(x) for x in v]
        if isinstance(v, dict):
            return {k: moved(x) for k, x in v.items()}
        return v

    info = moved(info)
    info["reused_from"] = donor.parent.name
    write_json_atomic(stage.marker, info)
