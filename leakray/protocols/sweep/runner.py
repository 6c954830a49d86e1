"""Run a sweep: validate every cell, then run (or resume, or skip) each and record it.

A cell is a simulate run; its run directory is content-addressed by config, tasks and (through
its path) the code version, and `run_simulation` resumes from per-stage markers. A cell whose
report.json exists is not run again (Ray is not even started for it); it is only recorded."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from leakray.console import Console
from leakray.storage import store_for
from leakray.protocols.sweep import catalog
from leakray.protocols.sweep.spec import Cell, plan
from leakray.protocols.sweep.version import code_version, git_commit


@dataclass
class SweepResult:
    run: str  # the sweep run's id in the catalog
    catalog: Path
    cells: list[Cell]
    ran: list[str] = field(default_factory=list)  # cells computed (or resumed) by this invocation
    skipped: list[str] = field(default_factory=list)  # cells finished before
    failed: dict[str, str] = field(default_factory=dict)  # cell -> error
    rows_written: int = 0


def run_sweep(spec_path: str | Path, extra: list[str] = (), pre: list[str] = (), output_dir: str | None = None,
              console: Console | None = None) -> SweepResult:
    from leakray.protocols.simulate import run_simulation

    console = console or Console()
    version = code_version()
    spec, out_dir, cells = plan(spec_path, extra, pre, version, output_dir)  # all cells valid, or BadInput
    sweep_store = store_for(out_dir)  # a URI sweep: its catalog is pushed after every cell
    console.say(f"sweep {spec.name}: {len(cells)} cells ({len(spec.models)} models x {len(spec.benchmarks)} "
                f"benchmarks), code {version}, output {sweep_store.location if sweep_store else out_dir}")
    con = catalog.connect(catalog.catalog_path(out_dir))
    result = SweepResult(catalog.start_run(con, spec.name, version, git_commit(), spec.model_dump()),
                         catalog.catalog_path(out_dir), cells)
    try:
        for i, cell in enumerate(cells, 1):
            t0 = time.perf_counter()
            try:
                if cell.finished:
                    result.skipped.append(cell.label)
                    cell.fetch_results()  # finished on another node: what the catalog reads
                else:
                    console.say(f"cell {i}/{len(cells)} {cell.label}: {cell.location}")
                    got = run_simulation(cell.cfg, console)
                    if got.resolve() != cell.run_dir.resolve():  # the plan and the protocol disagree on keys
                        raise RuntimeError(f"run dir {got} is not the planned {cell.run_dir}")
                    result.ran.append(cell.label)
                written = catalog.record_cell(con, result.run, spec.name, cell.model, cell.benchmark,
                                              cell.run_dir.resolve(), version, cell.location)
                result.rows_written += written
                if sweep_store is not None:  # autocommit: the cell's rows are in the file
                    sweep_store.push()
                console.say(f"cell {i}/{len(cells)} {cell.label}: "
                            f"{'done before' if cell.label in result.skipped else 'done'} "
                            f"({time.perf_counter() - t0:.1f} s, {written} catalog rows new)")
            except Exception as exc:  # noqa: BLE001 - one broken cell must not stop a scheduled sweep
                result.failed[cell.label] = f"{type(exc).__name__}: {exc}"
                console.warn(f"cell {cell.label} failed: {result.failed[cell.label]}")
        status = "ok" if not result.failed else f"failed: {', '.join(sorted(result.failed))}"
        catalog.finish_run(con, result.run, status)
    finally:
        con.close()
        if sweep_store is not None:
            sweep_store.close()
    where = f"{sweep_store.location}/{catalog.FILE} (staged in {result.catalog})" if sweep_store else result.catalog
    console.say(f"sweep run {result.run}: {len(result.ran)} ran, {len(result.skipped)} done before, "
                f"{len(result.failed)} failed; catalog {where}")
    return result
