"""A clean code corpus for the `pretrain-mix` leak: installed site-packages source (the base
model was pretrained on the standard library, see `models.offline.stdlib_sources`), read in a
seeded order up to a byte budget, exact duplicates dropped, and every file that near-duplicates
a benchmark task's reference or prompt removed by leakray's own screener, so the corpus leaks
nothing by accident. Cached under `cache_root()`: one corpus serves every dose and run.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sysconfig
import time
from pathlib import Path

from leakray.runs import cache_root, content_hash, write_json_atomic
from leakray.schema import P, T
from leakray.screen.corpus import read_source_file
from leakray.screen.index import BenchmarkIndex, ScreenConfig
from leakray.screen.screener import ENTRY, Stats, screen_documents

CORPUS_VERSION = 1  # bump when the selection rule changes: part of the cache key
MAX_FILE_BYTES = 100_000  # bigger files are mostly generated tables, and would eat the budget alone
SCREEN_BATCH = 256  # files screened per call
_SKIP_DIRS = {"__pycache__"}


def default_roots() -> list[Path]:
    """The running interpreter's site-packages (never the stdlib the base model saw)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    roots = []
    for key in ("purelib", "platlib"):
        p = Path(sysconfig.get_paths()[key]).resolve()
        if p.is_dir() and p not in roots:
            roots.append(p)
    # a site-packages inside the stdlib folder (a non-venv install) is fine; the stdlib itself is not
    return [r for r in roots if r != stdlib]


def package_list(roots: list[Path]) -> list[str]:
    """Top-level entries of each root (dist-info names carry versions): the corpus's fingerprint."""
    out = []
    for r in roots:
        try:
            out.extend(f"{r}:{e.name}" for e in sorted(os.scandir(r), key=lambda e: e.name))
        except OSError:
            continue
    return out


def task_digests(tasks: list[dict]) -> list[str]:
    return [hashlib.sha256(json.dumps([t[T.TASK_ID], t[T.PROMPT], t[T.REFERENCE]]).encode()).hexdigest()[:16]
            for t in tasks]


def _source_files(roots: list[Path], seed: int) -> list[Path]:
    files = []
    for r in roots:
        for dirpath, dirnames, filenames in os.walk(r):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    files.sort()
    random.Random(seed).shuffle(files)  # a spread over all packages, the same for the same seed
    return files


def _screen_texts(tasks: list[dict]) -> tuple[list[str], list[str]]:
    """What a corpus file must not near-duplicate: each task's reference and prompt."""
    texts, owners = [], []
    for t in tasks:
        for field in (T.REFERENCE, T.PROMPT):
            texts.append(t[field])
            owners.append(t[T.TASK_ID])
    return texts, owners


def clean_corpus(tasks: list[dict], max_bytes: int, seed: int, roots: list[str | Path] | None = None,
                 screen: ScreenConfig | None = None) -> tuple[list[str], dict]:
    """Texts of the clean corpus (at most max_bytes of UTF-8) and its stats; cached."""
    roots = [Path(r).resolve() for r in (roots or default_roots())]
    screen = screen or ScreenConfig()
    key = content_hash(CORPUS_VERSION, task_digests(tasks), max_bytes, seed, package_list(roots),
                       MAX_FILE_BYTES, screen.digest())
    out = cache_root() / f"clean-corpus-{key}"
    if (out / "stats.json").exists():
        texts = json.loads((out / "texts.json").read_text())
        return texts, {**json.loads((out / "stats.json").read_text()), "cached": True}

    t0 = time.perf_counter()
    texts_idx, owners = _screen_texts(tasks)
    index = BenchmarkIndex(screen, texts_idx)
    seen_hashes: set[str] = set()
    kept_texts: list[str] = []
    kept_paths: list[str] = []
    skipped: dict[str, int] = {}
    removed: dict[str, list[str]] = {}  # corpus file -> matched task ids
    n_seen = n_dup = total = unread = 0
    screen_stats = Stats()
    pending: list[tuple[str, bytes]] = []
    full = False

    def flush() -> None:
        nonlocal total, full, unread
        if not pending:
            return
        ids = [p for p, _ in pending]
        pairs = screen_documents(index, ids, [d for _, d in pending], screen_stats, with_text=False)
        for pair in pairs:
            removed.setdefault(pair[P.CORPUS_ID], []).append(owners[pair[ENTRY]])
        for path, data in pending:  # in the seeded order, so the kept set does not depend on batching
            if full:
                unread += 1  # read ahead of the budget's end: not part of this corpus's selection
                removed.pop(path, None)
                continue
            if path in removed:
                continue
            if total + len(data) > max_bytes:
                full = True
                continue
            kept_texts.append(data.decode("utf-8"))
            kept_paths.append(path)
            total += len(data)
        pending.clear()

    for path in _source_files(roots, seed):
        if full:
            break
        n_seen += 1
        data, reason = read_source_file(str(path), MAX_FILE_BYTES)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen_hashes:
            n_dup += 1
            continue
        seen_hashes.add(digest)
        pending.append((str(path), data))
        if len(pending) >= SCREEN_BATCH:
            flush()
    flush()

    stats = {
        "roots": [str(r) for r in roots], "max_bytes": max_bytes, "seed": seed, "files_seen": n_seen - unread,
        "kept": len(kept_texts), "bytes": total, "budget_filled": full, "removed_duplicates": n_dup,
        "removed_by_screen": {"files": len(removed),
                              "task_ids": sorted({t for ids in removed.values() for t in ids}),
                              "examples": {p: sorted(set(ids)) for p, ids in sorted(removed.items())[:20]}},
        "skipped": skipped, "screen": {"config_digest": screen.digest(), "pairs": int(screen_stats["pairs"])},
        "seconds": round(time.perf_counter() - t0, 1), "key": key,
    }
    tmp = out.with_name(out.name + f".partial{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "texts.json").write_text(json.dumps(kept_texts))
    (tmp / "sources.json").write_text(json.dumps(kept_paths))
    write_json_atomic(tmp / "stats.json", stats)
    try:
        os.replace(tmp, out)  # renamed only when complete: a killed build is redone
    except OSError:  # another process finished first: its corpus is the same
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return kept_texts, {**stats, "cached": False}
