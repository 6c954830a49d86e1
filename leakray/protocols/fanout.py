"""One protocol over several configs under one parent directory, then one aggregate: the
benchmarks of a multi-benchmark run, the doses of a dose sweep. Each child is a whole run
with its own markers (resumable on its own); the parent's aggregate is recomputed from the
children's reports every time, so a resumed fan-out costs only its unfinished children."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from leakray.runs import FANOUT_MARK, write_json_atomic
from leakray.storage import RunStore, join

# (config, console) -> run directory
RunOne = Callable[[Any, Any], Path]


def fan_out(output_dir: str, name: str, children: Sequence[tuple[str, Callable[[str], Any]]], run: RunOne,
            console, aggregate: Callable[[Path, dict[str, Path]], None]) -> Path:
    """``children``: (label, output_dir -> that child's config); each child runs under
    ``<output_dir>/<name>/``; ``aggregate(parent_dir, {label: run_dir})`` writes the parent's
    outputs. A URI output is staged locally and mirrored when the aggregate is written."""
    store = RunStore(output_dir, name)
    # marks the directory as a fan-out's: its children adopt stages from other fan-outs' (runs.donor_roots)
    write_json_atomic(store.local / FANOUT_MARK, {"children": [label for label, _ in children]})
    inner = join(output_dir, store.name)
    runs: dict[str, Path] = {}
    try:
        for i, (label, child) in enumerate(children, 1):
            console.say(f"{label} ({i}/{len(children)})")
            runs[label] = run(child(inner), console)
        aggregate(store.local, runs)
    finally:
        store.close()
    return store.local
