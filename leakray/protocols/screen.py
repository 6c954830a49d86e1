"""`leakray screen` as a protocol: two resumable stages on the run directory, like every other
protocol (`StageRunner` markers, stats, mirroring to a URI):

- ``corpus_pass``: index every benchmark once, stream the corpus once (in-process, or a Ray Data
  actor pool: `executor.screen`), keep the verified pairs and the corpus counts;
- ``outputs``: pairs.parquet, labels.csv, the cleaned benchmarks, summary.json.

The run key (config, benchmark files, corpus fingerprint) is kept beside the markers: a
directory finished for other inputs is screened again, never reported as done."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from leakray.parts import per_second
from leakray.runs import StageRunner, StageSpec, write_json_atomic
from leakray.screen import driver as D
from leakray.screen import outputs as O
from leakray.screen.index import ScreenConfig

STAGES = ("corpus_pass", "outputs")
KEY_FILE = "screen_key.json"
PASS_FILE = "pass.json.gz"


class LogConsole:
    """StageRunner's console for a screen: one log line per stage."""

    def __init__(self, log):
        self.log = log

    def stage(self, name: str, info: dict, summary: str, cached: bool) -> None:
        done = "already done" if cached else f"done in {info.get('seconds')}s"
        self.log(f"{name}: {done}" + (f"; {summary}" if summary else ""))


def run_screen(benchmarks: list[tuple[str, str]], corpus: str, output: str, config: ScreenConfig | None = None,
               *, engine: str = "ray", workers: int | None = None, address: str | None = None,
               num_cpus: int | None = None, force: bool = False, log=None) -> dict:
    """Screen every benchmark against the corpus in one pass; returns summary.json's content."""
    from leakray.storage import RunStore, is_uri

    log = log or D.default_log
    store = RunStore(output, "") if is_uri(output) else None  # a URI: staged here, mirrored there
    if store is not None:
        log(f"output {store.location} (staged in {store.local})")
        output = str(store.local)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    prep = D.prepare(benchmarks, corpus, config)
    if not force and O.finished(out, prep.key):
        log(f"{output} is complete for these inputs (run key {prep.key}); nothing to do")
        return json.loads((out / O.SUMMARY).read_text())
    _claim(out, prep.key, force)

    def pass_stage(stage_dir: Path) -> dict:
        if engine == "local":
            batches = D.local_batches
        else:
            from leakray.executor.runtime import ensure_ray
            from leakray.executor.screen import ray_batches

            ensure_ray(address, num_cpus, verbose=False)

            def batches(index, plan):
                return ray_batches(index, plan, workers)
        pairs, corpus_stats, screenable = D.corpus_pass(prep, batches, engine, log)
        with gzip.open(stage_dir / PASS_FILE, "wt", encoding="utf-8") as fh:
            json.dump({"pairs": pairs, "corpus": corpus_stats, "screenable": screenable}, fh, default=_plain)
        f, busy = corpus_stats["files"], corpus_stats["worker_seconds"]
        # the screeners' own seconds (summed over workers, as a collection's parts) and their pace
        return {"rows_in": f["in"], "rows_out": corpus_stats["pairs"], "errors": f["skipped"],
                "documents": corpus_stats["documents"], "part_seconds": {"screen": busy},
                "throughput": {"files_screened_per_s": per_second(f["screened"], busy),
                               "documents_screened_per_s": per_second(corpus_stats["documents"], busy)}}

    def outputs_stage(stage_dir: Path) -> dict:
        with gzip.open(out / "corpus_pass" / PASS_FILE, "rt", encoding="utf-8") as fh:
            got = json.load(fh)
        seconds = runner.info["corpus_pass"].get("seconds") or 0.0
        summary = D.write_outputs(prep, got["pairs"], got["corpus"], got["screenable"], str(out), seconds, log)
        return {"rows_in": len(got["pairs"]), "rows_out": sum(b["n_leaked"] for b in summary["benchmarks"].values())}

    runner = StageRunner(out, LogConsole(log), store)
    runner.run([StageSpec("corpus_pass", pass_stage, lambda i: f"{i['rows_in']} files, {i['rows_out']} pairs"),
                StageSpec("outputs", outputs_stage, lambda i: f"{i['rows_out']} samples leaked")])
    summary = json.loads((out / O.SUMMARY).read_text())
    if store is not None:
        store.close()
    return summary


def _claim(out: Path, key: str, force: bool) -> None:
    """Stage markers left by a run of other inputs (or any, with ``force``) are not this run's."""
    try:
        mine = json.loads((out / KEY_FILE).read_text()).get("run_key") == key
    except (OSError, ValueError):
        mine = False
    if force or not mine:
        for name in STAGES:
            shutil.rmtree(out / name, ignore_errors=True)
    write_json_atomic(out / KEY_FILE, {"run_key": key})


def _plain(v):
    """numpy scalars in worker records (the in-process pass) as JSON numbers."""
    return v.item() if hasattr(v, "item") else str(v)
