"""A sweep file, and its expansion into cells (one simulate config per model x benchmark).

Every cell's config goes through `leakray.config.load_config` and its benchmark is loaded
before any cell runs, so a typo in the last cell is refused before hours of work on the first."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from leakray.config import SimulateConfig, _error_line, load_config, read_yaml
from leakray.errors import BadInput
from leakray.runs import output_root

Overrides = dict[str, Any] | list[str]  # {"sample.k": 2} or ["sample.k=2"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _as_list(v: Overrides) -> list[str]:
    """`key=value` strings for `load_config`; mapping values are JSON (a YAML subset), so their
    types survive the round trip ("yes" stays a string, 3 an int)."""
    if isinstance(v, dict):
        return [f"{k}={json.dumps(val)}" for k, val in v.items()]
    for item in v:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key.sub=value")
    return list(v)


class BaseSection(_Strict):
    config: list[str] = Field(default_factory=list)  # simulate config files, relative to the sweep file
    set: Overrides = Field(default_factory=list)

    @field_validator("config", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v


class ModelEntry(_Strict):
    name: str = Field(min_length=1)  # the label in the catalog
    set: Overrides = Field(default_factory=list)  # e.g. {model.base: ..., sample.backend: openai}


class BenchmarkEntry(_Strict):
    name: str  # benchmark.name: a registered reader, or a label of your own with `path`
    label: str | None = None  # the label in the catalog (default: name); needed when a name repeats
    path: str | None = None  # benchmark.path, relative to the sweep file
    set: Overrides = Field(default_factory=list)

    @property
    def key(self) -> str:
        return self.label or self.name


class SweepSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    output_dir: str = "sweeps"  # holds catalog.sqlite and runs/<code version>/<cell run dirs>
    base: BaseSection = Field(default_factory=BaseSection)
    models: list[ModelEntry] = Field(min_length=1)
    benchmarks: list[BenchmarkEntry] = Field(min_length=1)
    detectors: Literal["all"] | list[str] | None = None  # detect.detectors of every cell (None: the base's)

    @model_validator(mode="after")
    def _unique_labels(self):
        for what, keys in (("models", [m.name for m in self.models]), ("benchmarks", [b.key for b in self.benchmarks])):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            if dup:
                raise ValueError(f"{what}: label {dup[0]!r} appears twice (give each entry its own name/label)")
        return self


@dataclass
class Cell:
    model: str
    benchmark: str
    overrides: list[str]  # what made this cell's config, after the base files (kept for the record)
    cfg: SimulateConfig
    run_dir: Path  # where run_simulation will write (content-addressed: config + tasks + code version)
    store: object = None  # the run's `storage.RunStore` (opened lazily) when the sweep writes to a URI

    @property
    def label(self) -> str:
        return f"{self.model} x {self.benchmark}"

    @property
    def finished(self) -> bool:
        if (self.run_dir / "report.json").exists():
            return True
        return self.remote is not None and self.remote.exists("report.json")

    @property
    def remote(self):
        """The cell's run at the sweep's URI, opened without pulling (None for a local sweep)."""
        from leakray.storage import RunStore, is_uri

        if self.store is None and is_uri(self.cfg.output_dir):
            self.store = RunStore(self.cfg.output_dir, self.run_dir.name, pull=False)
        return self.store

    @property
    def location(self) -> str:
        """Where the cell's run lives: its URI for a URI sweep, else its directory."""
        return self.remote.location if self.remote is not None else str(self.run_dir.resolve())

    def fetch_results(self) -> None:
        """What the catalog records of a cell finished elsewhere: its report and scores."""
        if self.remote is not None:
            self.remote.pull(("report.json", "detect/scores.parquet"))


def read_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    raw = read_yaml(path)
    raw.setdefault("name", path.stem)
    try:
        spec = SweepSpec.model_validate(raw)
        for entry in (spec.base, *spec.models, *spec.benchmarks):
            entry.set = _as_list(entry.set)
    except (ValidationError, ValueError) as exc:
        msg = "; ".join(dict.fromkeys(_error_line(e, SweepSpec).replace("config key", "sweep key")
                                      for e in exc.errors())) if isinstance(exc, ValidationError) else str(exc)
        raise BadInput(msg, path=str(path)) from None
    return spec


def cell_overrides(spec: SweepSpec, model: ModelEntry, bench: BenchmarkEntry, here: Path,
                   pre: list[str], extra: list[str], cells_root: Path) -> list[str]:
    """`pre` (--quick), the base's overrides, then the benchmark's, the model's, the sweep's
    detectors, the command line's (`extra`); the output dir last (every cell of one code
    version shares a runs directory, so the code version is part of every run dir's path)."""
    out = list(pre) + list(spec.base.set)
    out.append(f"benchmark.name={json.dumps(bench.name)}")
    if bench.path is not None:
        out.append(f"benchmark.path={json.dumps(str((here / bench.path).expanduser()))}")
    out += list(bench.set) + list(model.set)
    if spec.detectors is not None:
        out.append(f"detect.detectors={json.dumps(spec.detectors)}")
    out += list(extra)
    out.append(f"output_dir={json.dumps(str(cells_root))}")
    return out


def sweep_root(output: str, code_version: str):
    """(the sweep's local directory, its RunStore or None, where the cells' runs go). A URI sweep
    is staged here with only its catalog pulled; its cells are runs under ``<URI>/runs/<version>``."""
    from leakray.storage import RunStore, is_uri, join

    if not is_uri(output):
        out_dir = output_root(output)
        return out_dir, None, out_dir / "runs" / code_version
    from leakray.protocols.sweep.catalog import FILE

    store = RunStore(output, "", pull=(FILE,))
    return store.local, store, join(join(output, "runs"), code_version)


def plan(spec_path: str | Path, extra: list[str] = (), pre: list[str] = (), code_version: str | None = None,
         output_dir: str | None = None) -> tuple[SweepSpec, Path, list[Cell]]:
    """(spec, sweep output dir, cells), every cell validated and its run dir known; or one BadInput."""
    from leakray.protocols.simulate import load_tasks, preflight_isolation, run_id
    from leakray.storage import local_run_dir
    from leakray.protocols.sweep.version import code_version as current_version

    spec_path = Path(spec_path)
    spec = read_spec(spec_path)
    here = spec_path.resolve().parent
    # relative to the working directory, like simulate's output_dir (a submitted job: under $LEAKRAY_HOME)
    out_dir, _, cells_root = sweep_root(output_dir or spec.output_dir, code_version or current_version())
    files = [str(here / f) for f in spec.base.config]
    cells = []
    for model in spec.models:
        for bench in spec.benchmarks:
            overrides = cell_overrides(spec, model, bench, here, list(pre), list(extra), cells_root)
            try:
                cfg = load_config(files, overrides)
                tasks = load_tasks(cfg)
                preflight_isolation(cfg)
            except BadInput as exc:
                raise BadInput(f"cell {model.name} x {bench.key}: {exc}", path=str(spec_path)) from None
            run_dir = local_run_dir(cfg.output_dir, f"{cfg.benchmark.name}-{run_id(cfg, tasks)}")
            cells.append(Cell(model.name, bench.key, overrides, cfg, run_dir))
    return spec, out_dir, cells

