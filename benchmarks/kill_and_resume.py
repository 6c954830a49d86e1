"""A collection killed midway, then resumed: what the second run reads back and what it asks for.

Runs `leakray simulate` on a small protocol (the fault tests' one-layer model, 16 tasks, two tasks
per batch) on its own local Ray, SIGKILLs the driver's whole process group as soon as the shadow
collection has written its first part file, then runs the same command again, and prints what
the resumed collection read back (`resumed_rows`), how many rows it holds and whether each is
there once.

    python benchmarks/kill_and_resume.py OUT_DIR

Run it on a quiet machine with no other local Ray of yours: after the kill it stops the killed
run's leftover workers by name (`ray::`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

SMALL = {"benchmark.limit": 16, "columns.advprompt": "false", "columns.upper_case": "false",
         "columns.reference_model": "null", "detect.bootstrap": 20, "detect.trace_memory": "false",
         "detect.seeds": "[0]", "model.tiny.vocab_size": 400, "model.tiny.n_layer": 1, "model.tiny.n_embd": 32,
         "model.tiny.n_head": 2, "model.tiny.n_positions": 512, "model.tiny.block_size": 64,
         "model.tiny.batch_size": 4, "model.tiny.max_steps": 10, "model.tiny.warmup_steps": 2,
         "model.tiny.corpus_mb": 0.3, "target.epochs": 2, "shadow.epochs": 2, "target.max_length": 256,
         "shadow.max_length": 256, "sample.k": 2, "sample.max_new_tokens": 24, "sample.batch_size": 2,
         "ray.sample_actors": 1, "detect.parallel": "false", "detect.detectors": "[ref_loss,gt_match]"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="an empty output directory")
    out = Path(ap.parse_args().out).resolve()
    cmd = [sys.executable, "-m", "leakray.cli", "simulate", "--output", str(out)]
    for key, value in SMALL.items():
        cmd += ["--set", f"{key}={value}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    parts = f"{out}/*/collect_shadow/kept/*/*/parts/*.parquet"
    t0 = time.perf_counter()
    with open(f"{out}.killed.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while not glob.glob(parts):
            if proc.poll() is not None:
                sys.exit(f"the run ended ({proc.returncode}) before its shadow collection wrote a part file")
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done = sorted(Path(m).parent.name for m in glob.glob(f"{out}/*/*/_DONE.json"))
    print(f"killed after {time.perf_counter() - t0:.0f} s with {len(glob.glob(parts))} part file(s) kept; "
          f"stages done: {', '.join(done)}")
    subprocess.run(["pkill", "-9", "-f", "ray::"], capture_output=True)
    with open(f"{out}.resumed.log", "w") as log:
        if subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode:
            sys.exit(f"the resumed run failed: {out}.resumed.log")
    (marker,) = glob.glob(f"{out}/*/collect_shadow/_DONE.json")
    info, stage = json.loads(Path(marker).read_text()), Path(marker).parent
    ids = pq.read_table(stage / "collection.parquet").column("task_id").to_pylist()
    print(f"resumed: {info.get('resumed_rows', 0)} rows read back, {len(ids)} rows in the collection "
          f"({'each once' if len(ids) == len(set(ids)) else 'DUPLICATES'}), "
          f"kept/ {'left behind' if (stage / 'kept').exists() else 'removed'}")


if __name__ == "__main__":
    main()
