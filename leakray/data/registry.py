"""Benchmark names and paths -> task lists. Readers register here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from leakray.errors import BadInput

# name -> reader(path or None) -> list[task dict]
READERS: dict[str, Callable[..., list[dict]]] = {}
# name -> default path (None: the reader knows where its data ships)
DEFAULT_PATHS: dict[str, str | None] = {}


def register(name: str, reader: Callable[..., list[dict]], default_path: str | None = None) -> None:
    READERS[name] = reader
    DEFAULT_PATHS[name] = default_path


def _builtin() -> None:
    from leakray.data.humaneval import read_humaneval
    from leakray.data.mbpp import read_mbpp

    register("humaneval", read_humaneval)
    register("mbpp", read_mbpp)


_builtin()


def load_benchmark(spec: str, path: str | Path | None = None) -> list[dict]:
    """Load tasks by registered name (optionally with a path), e.g. 'humaneval' or 'mbpp' + path."""
    if spec not in READERS:
        raise BadInput(f"unknown benchmark {spec!r}; known: {sorted(READERS)}")
    path = path or DEFAULT_PATHS.get(spec)
    return READERS[spec](path) if path else READERS[spec]()
