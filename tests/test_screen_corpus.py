"""`leakray screen` on a corpus holding HumanEval in every form a leak takes (built by
tests/screen_corpus.py, no network), the chance-match mechanism, and each reader."""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import screen_corpus as SC  # noqa: E402

from leakray.schema import P  # noqa: E402
from leakray.screen.index import BenchmarkIndex, ScreenConfig  # noqa: E402
from leakray.screen.parts import Entries  # noqa: E402
from leakray.screen.readers import Reader, Skip  # noqa: E402
from leakray.screen.screener import BatchScreener, Stats, screen_documents  # noqa: E402
from leakray.screen.shingle import shingle_batch  # noqa: E402


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from leakray.cli import main

    root = tmp_path_factory.mktemp("planted")
    corpus = SC.build(root)
    out = root / "out"
    assert main(["screen", "--benchmark", f"humaneval={corpus.benchmark}", "--corpus", str(corpus.root),
                 "--output", str(out), "--engine", "local"]) == 0
    return corpus, out


def _screenable(corpus) -> set[tuple[str, str]]:
    from leakray.data.registry import load_benchmark_file

    entries = Entries.from_tasks({"h": load_benchmark_file("humaneval", corpus.benchmark)})
    index = BenchmarkIndex.for_entries(ScreenConfig(), entries)
    return {(t, p) for t, p, ok in zip(entries.task_id, entries.field, index.screenable) if ok}


def test_every_planted_copy_is_found_with_part_and_provenance(planted, capsys):
    corpus, out = planted
    pairs = pq.read_table(out / "pairs.parquet").to_pylist()
    found = {(p[P.TASK_ID], p[P.PART], p[P.CORPUS_FILE]) for p in pairs}
    ok = _screenable(corpus)
    for form, copies in corpus.copies.items():
        want = {c for c in copies if c[:2] in ok}
        assert want, form
        assert want <= found, (form, sorted(want - found))
    # no false pair: every pair is a task with a file it was planted in
    planted_in = corpus.planted_files()
    assert all(p[P.CORPUS_FILE] in planted_in.get(p[P.TASK_ID], ()) for p in pairs)
    by_file = {}
    for p in pairs:
        by_file.setdefault(Path(p[P.CORPUS_FILE]).name, []).append(p)
    jl = by_file["human-eval-copy.jsonl"]
    assert {p[P.CORPUS_KEY] for p in jl} >= {"prompt", "canonical_solution"}
    assert all(p[P.CORPUS_RECORD] == p[P.LINE_START] == p[P.LINE_END] >= 1 for p in jl)
    assert {p[P.CORPUS_KEY] for p in by_file["samples.json"]} == {"prompt", "completion"}
    assert all(p[P.CORPUS_KEY].startswith("cells[") for p in by_file["practice.ipynb"])
    assert all(p[P.CORPUS_KEY] == "text" and p[P.CORPUS_RECORD] < SC.TASKS_PER_FORM
               for p in by_file["train-00000.parquet"])
    md = [p for name, ps in by_file.items() if name.endswith(".md") for p in ps]
    assert md and all(p[P.CORPUS_KEY].startswith("fence[") and p[P.LINE_START] > 4 for p in md)
    esc = by_file["prompts.py"]  # one escaped literal per line, from line 4 on
    assert esc and all(p[P.LINE_START] == p[P.LINE_END] >= 4 for p in esc)
    assert all(p[P.SPAN_COVERAGE] >= 0.5 for p in pairs)
    # the evidence: rare shingles, or (tests of numbers) number-bearing token runs
    for p in pairs:
        if p[P.MATCHED_BY] == "runs":
            assert p[P.PART] == "tests" and p[P.SHARED_RARE] is None and p[P.SHARED_RUNS] >= 4
            assert p[P.SHARED_RUNS] >= 0.7 * p[P.SAMPLE_RUNS] and p[P.CONTAINMENT] >= 0.8
        else:
            assert p[P.MATCHED_BY] in ("jaccard", "containment") and p[P.SHARED_RARE] >= 4 and p[P.SHARED_RUNS] is None
    tests_only = {f for _, _, f in corpus.copies["tests_only"]}
    assert any(p[P.MATCHED_BY] == "runs" and p[P.CORPUS_FILE] in tests_only for p in pairs)


def test_summary_accounts_for_every_file_and_reports_parts(planted):
    corpus, out = planted
    summary = json.loads((out / "summary.json").read_text())
    files = summary["corpus"]["files"]
    assert files["in"] == SC.count_files(corpus.root)
    assert files["accounted"] and files["screened"] + sum(files["skipped"].values()) == files["in"]
    assert files["skipped"] == corpus.skipped
    assert summary["corpus"]["documents"] > files["screened"]  # shard records are documents, files are not
    he = summary["benchmarks"]["humaneval"]
    ok = _screenable(corpus)
    planted_tasks = {t for copies in corpus.copies.values() for t, part, _ in copies if (t, part) in ok}
    assert set(he["leaked_task_ids"]) == planted_tasks
    assert he["ratio"] == len(planted_tasks) / len(corpus.tasks)
    assert he["n_unscreenable"] == 0 and he["parts"]["tests"]["n_screenable"] < len(corpus.tasks)
    assert set(he["parts"]) == {"prompt", "solution", "tests", "task"}
    assert all(v["n_leaked"] <= v["n_screenable"] for v in he["parts"].values())
    assert he["parts"]["prompt"]["n_screenable"] == len(corpus.tasks)
    assert set(he["documents_per_task"]) == planted_tasks
    # a task planted in a JSONL copy and a write-up elsewhere would count both; here each in its own
    assert min(he["documents_per_task"].values()) >= 1


def test_console_last_line_says_what_was_read(planted, tmp_path, capsys):
    from leakray.cli import main

    corpus, out = planted
    capsys.readouterr()
    assert main(["screen", "--benchmark", f"humaneval={corpus.benchmark}", "--corpus", str(corpus.root),
                 "--output", str(out), "--engine", "local"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    n = SC.count_files(corpus.root)
    assert f"{n} files:" in last and "4 skipped (binary 2, empty 1, unreadable 1)" in last
    assert "documents" in last and "humaneval" in last and str(out) in last


def test_a_benchmark_is_named_by_name_file_or_name_and_path(tmp_path, capsys):
    """`--benchmark humaneval` screens leakray's packaged copy (as `benchmarks validate` and
    `perturb` take it), a bare file is named for its stem; a name without a copy, or nothing
    that exists, is refused at the command line with what to give instead."""
    from leakray.cli import main
    from leakray.data.humaneval import packaged_path

    fix = Path(__file__).parent / "fixtures" / "screen"
    out = tmp_path / "out"
    assert main(["screen", "--benchmark", "humaneval", "--benchmark", str(fix / "mbpp.jsonl"),
                 "--corpus", str(fix / "corpus"), "--output", str(out), "--engine", "local"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["benchmarks"]) == {"humaneval", "mbpp"}
    he = summary["benchmarks"]["humaneval"]
    assert he["path"] == str(packaged_path()) and he["n_samples"] == 164  # the packaged HumanEval, whole
    assert he["leaked_task_ids"] == ["HumanEval/0"]  # the corpus holds a copy of HumanEval/0
    assert (out / he["clean_export"]).exists() and summary["benchmarks"]["mbpp"]["n_samples"] == 3
    for bad, says in (("mbpp", "mbpp=PATH"), ("nope", "neither NAME=PATH, a file, nor a registered benchmark")):
        with pytest.raises(SystemExit):
            main(["screen", "--benchmark", bad, "--corpus", str(fix / "corpus"), "--output", str(out)])
        assert says in capsys.readouterr().err


# ---------------------------------------------------------------- chance matches


def _numeric_tests(rng, n_lines, name):
    return "\n".join(f"    assert {name}([{', '.join(str(rng.randrange(10)) for _ in range(5))}], {rng.randrange(10)})"
                     f" == {rng.randrange(10)}" for _ in range(n_lines))


def test_short_sample_is_not_matched_by_chance_in_a_large_unrelated_file():
    """The chance match seen on a real corpus: a short test-like sample, mostly punctuation and
    numbers, 'contained' (>= 0.8 of its shingles) in a large unrelated test file."""
    rng = random.Random(3)
    sample = ("def check(candidate):\n" + _numeric_tests(rng, 6, "candidate")
              + "\n    assert candidate([1, 2], parse_nested_parens) == 3\n")
    big = "import pytest\n\n\ndef check(candidate):\n    return candidate\n\n" + "\n".join(
        f"def test_{i}():\n" + _numeric_tests(rng, 3, "compute") + f"\n    assert len(data[{rng.randrange(1000)}]) == "
        f"{rng.randrange(1000)}" for i in range(1500))
    sets = shingle_batch([sample, big])
    shared = len(np.intersect1d(sets[0], sets[1]))
    assert sets.sizes[1] > 6000 and shared / sets.sizes[0] >= 0.8  # the old rule called this a copy
    index = BenchmarkIndex(ScreenConfig(), [sample])
    assert index.screenable[0] and index.contain_ok[0]
    stats = Stats()
    assert screen_documents(index, ["big_test.py"], [big.encode()], stats) == []
    # recall held: the same sample really copied into that file is found, with its lines
    lines = big.split("\n")
    copy = "\n".join(lines[:100] + [sample] + lines[100:])
    pairs = screen_documents(index, ["copy.py"], [copy.encode()])
    assert len(pairs) == 1 and pairs[0][P.CONTAINMENT] == 1.0 and pairs[0][P.SPAN_COVERAGE] == 1.0
    assert pairs[0][P.LINE_START] == 101


def test_tests_of_numbers_are_screened_by_runs_without_chance_matches():
    """Tests made of numbers and the boilerplate name `candidate` have no rare shingles; their
    number-bearing token runs find a copy, while a large harness file of the same shape (other
    tests of `candidate` on random numbers, >= 0.8 of the sample's shingles) matches nothing."""
    rng = random.Random(8)
    tests = ["def check(candidate):\n" + _numeric_tests(rng, rng.randrange(4, 9), "candidate") + "\n"
             for _ in range(12)]
    index = BenchmarkIndex(ScreenConfig(), tests, data=[True] * len(tests))
    assert not index.by_rare.any() and index.by_runs.all()  # "candidate" is boilerplate: no rare shingle
    assert not BenchmarkIndex(ScreenConfig(), tests).screenable.any()  # code is never screened by runs
    big = "\n".join(f"def check_{i}(candidate):\n" + _numeric_tests(rng, 4, "candidate") for i in range(1500))
    sets = shingle_batch(tests + [big])
    assert all(len(np.intersect1d(sets[i], sets[len(tests)])) / sets.sizes[i] >= 0.8 for i in range(len(tests)))
    stats = Stats()
    assert screen_documents(index, ["harness.py"], [big.encode()], stats) == []
    assert stats["candidates"] == 0  # not even a candidate: the runs are the test's own numbers
    # recall: each tests part copied into that file, or alone
    lines = big.split("\n")
    for i, t in enumerate(tests):
        copy = "\n".join(lines[:40 * i] + [t] + lines[40 * i:])
        pairs = screen_documents(index, ["copy.py", "alone.py"], [copy.encode(), t.encode()])
        assert {(p[P.CORPUS_ID], p["entry"], p[P.MATCHED_BY]) for p in pairs} == {
            ("copy.py", i, "runs"), ("alone.py", i, "runs")}
        assert all(p[P.SHARED_RUNS] == p[P.SAMPLE_RUNS] and p[P.SPAN_COVERAGE] == 1.0 for p in pairs)
        assert pairs[0][P.LINE_START] == 40 * i + 1


def test_span_check_rejects_shingles_shared_out_of_order():
    sample = ("def rolling_max(numbers, window):\n    result = []\n    running_max = None\n"
              "    for n in numbers:\n        running_max = n if running_max is None else max(running_max, n)\n"
              "        result.append(running_max)\n    return result\n")
    from leakray.screen.shingle import tokenize

    toks = [t.decode() for t in tokenize(sample)]
    bigrams = [f"{a} {b}" for a, b in zip(toks, toks[1:])]
    random.Random(0).shuffle(bigrams)
    shuffled = "\n".join(f"{b}  # {i}" for i, b in enumerate(bigrams))  # every shingle, no run of 3 tokens
    index = BenchmarkIndex(ScreenConfig(span_tokens=8), [sample])
    stats = Stats()
    assert screen_documents(index, ["shuffled.py"], [shuffled.encode()], stats) == []
    assert stats["rejected_by_span"] == 1
    assert screen_documents(BenchmarkIndex(ScreenConfig(span_coverage=0.0), [sample]), ["s"], [shuffled.encode()])


def test_false_positives_on_unrelated_code_are_zero():
    from leakray.data.registry import load_benchmark

    entries = Entries.from_tasks({"humaneval": load_benchmark("humaneval")})
    index = BenchmarkIndex.for_entries(ScreenConfig(), entries)
    paths = SC.unrelated_sources(300, seed=5)
    stats = Stats()
    pairs = screen_documents(index, [str(p) for p in paths], [p.read_bytes() for p in paths], stats)
    assert pairs == [] and stats["texts_screened"] == len(paths)


# ---------------------------------------------------------------- readers


def _read(path, **kw):
    counts = Stats()
    reader = Reader(kw.get("max_text", 1 << 20), kw.get("max_parse", 1 << 22), kw.get("min_text", 8),
                    kw.get("columns", ()))
    return list(reader.read(str(path), counts)), counts


def test_json_walks_every_string_with_its_key_path(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps({"a": {"x": "some text value here", "n": 3}, "b": {"y": ["first string long", "no"]}}))
    pieces, counts = _read(p)
    got = {(x.record, x.key, x.reason) for x in pieces}
    assert got == {(0, "a.x", None), (1, "b.y[0]", None), (1, "b.y[1]", "too_short")}
    assert counts["documents"] == 2


def test_markdown_fences_and_prose_keep_their_lines(tmp_path):
    p = tmp_path / "w.md"
    p.write_text("# Title\n\nProse line.\n\n```python\ndef f():\n    return 1\n```\n\n~~~\nplain block\n~~~\nEnd.\n")
    pieces, _ = _read(p)
    keys = [(x.key, x.line) for x in pieces]
    assert keys == [("fence[0] python", 6), ("fence[1]", 11), ("text", 1)]
    prose = pieces[-1].data.decode()
    assert "def f" not in prose and prose.count("\n") == p.read_text().count("\n") and "End." in prose


def test_escaped_code_tokenizes_like_the_code():
    code = 'def f(s):\n    """Say "hi"."""\n    return s.split("\\n")\n'
    as_json = json.dumps(json.dumps(code))  # escaped twice: a JSON string inside a JSON string
    sets = shingle_batch([code, repr(code), as_json])
    for i in (1, 2):
        assert len(np.intersect1d(sets[0], sets[i])) == sets.sizes[0]


@pytest.mark.parametrize("suffix", [".gz", ".zst", ".bz2", ".xz"])
def test_compressed_shards_stream(tmp_path, suffix):
    import bz2
    import lzma

    data = "".join(json.dumps({"text": f"line number {i} of a compressed shard"}) + "\n" for i in range(50)).encode()
    comp = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
            ".zst": lambda d: pa.compress(d, codec="zstd", asbytes=True)}[suffix]
    p = tmp_path / f"s.jsonl{suffix}"
    p.write_bytes(comp(data))
    pieces, counts = _read(p)
    assert [x.record for x in pieces] == list(range(1, 51)) and counts["documents"] == 50
    broken = tmp_path / f"broken.jsonl{suffix}"
    broken.write_bytes(comp(data)[: len(comp(data)) // 2])
    pairs, st = BatchScreener(BenchmarkIndex(ScreenConfig(), ["x = 1"]), "files")({"path": [str(broken)]})
    assert st["files_in"] == 1 and (st["files_truncated"] == 1 or st["files_skipped:unreadable"] == 1)


def test_parquet_and_arrow_columns_named_or_sniffed(tmp_path):
    table = pa.table({"id": ["a", "b"], "body": ["def long_function_name(x):\n    return x * 2\n"] * 2,
                      "lang": ["py", "py"]})
    pq.write_table(table, tmp_path / "t.parquet")
    pieces, counts = _read(tmp_path / "t.parquet")
    assert {(x.record, x.key) for x in pieces} == {(0, "body"), (1, "body")} and counts["documents"] == 2
    pieces, _ = _read(tmp_path / "t.parquet", columns=("lang",))
    assert {x.key for x in pieces} == {"lang"}
    with pytest.raises(Skip, match="no_text_column"):
        _read(tmp_path / "t.parquet", columns=("missing",))
    with pa.OSFile(str(tmp_path / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)  # the file format (the stream format is in the planted corpus)
    pieces, _ = _read(tmp_path / "t.arrow")
    assert {(x.record, x.key) for x in pieces} == {(0, "body"), (1, "body")}


def test_unknown_extensions_are_sniffed(tmp_path):
    (tmp_path / "a.weird").write_text('{"k": "a string value long enough"}\n{"k": "another string value"}\n')
    (tmp_path / "b.weird").write_bytes(b"\x00\x01binary")
    (tmp_path / "c").write_text("plain text file content\n")
    pieces, _ = _read(tmp_path / "a.weird")
    assert [(x.record, x.key) for x in pieces] == [(1, "k"), (2, "k")]
    with pytest.raises(Skip, match="binary"):
        _read(tmp_path / "b.weird")
    pieces, _ = _read(tmp_path / "c")
    assert pieces[0].key == "" and pieces[0].record is None


def _tar(path: Path, files: dict[str, bytes], mode: str = "w:gz", links: dict[str, str] | None = None) -> Path:
    import io
    import tarfile

    with tarfile.open(path, mode) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return path


def _zip(files: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


CODE = b"def long_function_name(values):\n    return sorted(set(values))[::-1]\n"


def test_archives_are_read_member_by_member_as_the_files_they_hold(tmp_path):
    """A repository tarball and a zip: each member read by its own format (code, JSONL, a notebook,
    a member's own compression, an archive inside), every member not screened counted with its
    reason under the archive's name, none written to disk."""
    nb = json.dumps({"cells": [{"cell_type": "code", "source": CODE.decode(), "outputs": []}]}).encode()
    members = {"repo/src/a.py": CODE, "repo/data/train.jsonl": b'{"text": "first record, long enough"}\n'
               b'{"text": "second record, long enough"}\n', "repo/nb/n.ipynb": nb,
               "repo/src/b.py.gz": gzip.compress(CODE), "repo/logo.png": b"\x89PNG" + bytes(range(256)),
               "repo/empty.py": b"", "repo/vendor.zip": _zip({"inner/c.py": CODE}),
               "repo/big.py": b"x = 1\n" * 100}
    tar = _tar(tmp_path / "repo.tar.gz", members, links={"repo/link.py": "src/a.py"})
    pieces, counts = _read(tar, max_text=400)
    got = {(x.file.split("!", 1)[1], x.record, x.key, x.reason) for x in pieces}
    assert got == {("repo/src/a.py", None, "", None), ("repo/data/train.jsonl", 1, "text", None),
                   ("repo/data/train.jsonl", 2, "text", None), ("repo/nb/n.ipynb", None, "cells[0].source", None),
                   ("repo/src/b.py.gz", None, "", None), ("repo/logo.png", None, "", "binary"),
                   ("repo/empty.py", None, "", "empty"), ("repo/vendor.zip!inner/c.py", None, "", None),
                   ("repo/big.py", None, "", "huge"), ("repo/link.py", None, "", "link")}
    assert all(x.file.startswith(f"{tar}!") for x in pieces)
    assert {x.data for x in pieces if x.file.endswith((".py", ".py.gz"))} == {CODE, None}
    # the same members in a zip, and the tar uncompressed, read the same
    (tmp_path / "repo.zip").write_bytes(_zip(members))
    z, _ = _read(tmp_path / "repo.zip", max_text=400)
    plain, _ = _read(_tar(tmp_path / "repo.tar", members, mode="w"), max_text=400)
    strip = lambda ps: {(x.file.split("!", 1)[1], x.key, x.reason) for x in ps}  # noqa: E731
    assert strip(z) == strip(plain) == strip(pieces) - {("repo/link.py", "", "link")}
    # a wheel and a sources jar are zips: their sources are read, a class file is skipped by name
    (tmp_path / "pkg-1.0-py3-none-any.whl").write_bytes(_zip({"pkg/m.py": CODE, "pkg-1.0.dist-info/RECORD": b""}))
    (tmp_path / "lib-sources.jar").write_bytes(_zip({"org/x/A.java": CODE, "org/x/A.class": b"\xca\xfe\xba\xbe"}))
    assert [(x.file.rsplit("!", 1)[1], x.reason) for x in _read(tmp_path / "pkg-1.0-py3-none-any.whl")[0]] == \
        [("pkg/m.py", None), ("pkg-1.0.dist-info/RECORD", "empty")]
    assert [(x.file.rsplit("!", 1)[1], x.reason) for x in _read(tmp_path / "lib-sources.jar")[0]] == \
        [("org/x/A.java", None), ("org/x/A.class", "binary")]
    # an archive nested deeper than MAX_ARCHIVE_DEPTH is counted, not opened
    deep = CODE
    for level in range(4):
        deep = _zip({f"l{level}.zip" if level else "c.py": deep})
    (tmp_path / "deep.zip").write_bytes(deep)
    (piece,) = _read(tmp_path / "deep.zip")[0]
    assert piece.reason == "nested_too_deep" and piece.file.count("!") == 3


def test_a_broken_archive_keeps_what_it_gave_and_counts_the_rest(tmp_path):
    data = _tar(tmp_path / "r.tar.gz", {f"src/m{i}.py": CODE.replace(b"values", f"values{i}".encode())
                                        for i in range(40)}).read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.zip").write_bytes(b"PK\x03\x04 not a zip at all")
    index = BenchmarkIndex(ScreenConfig(), ["x = 1"])
    _, st = BatchScreener(index, "files")({"path": [str(cut), str(tmp_path / "junk.zip")]})
    assert st["files_in"] == 2 and st["files_truncated"] == 1 and st["files_skipped:unreadable"] == 1
    assert 0 < st["documents"] < 40


@pytest.mark.parametrize("mode", ["w:bz2", "w:xz", "zst"])
def test_every_compression_of_a_tarball_reads_the_same(tmp_path, mode):
    files = {"p/a.py": CODE, "p/b.md": b"# Notes\n\n```python\n" + CODE + b"```\n"}
    if mode == "zst":
        raw = _tar(tmp_path / "p.tar", files, mode="w").read_bytes()
        path = tmp_path / "p.tar.zst"
        path.write_bytes(pa.compress(raw, codec="zstd", asbytes=True))
    else:
        path = _tar(tmp_path / f"p.tar.{mode[2:]}", files, mode=mode)
    pieces, counts = _read(path)
    assert {(x.file.split("!", 1)[1], x.key) for x in pieces} == {("p/a.py", ""), ("p/b.md", "fence[0] python"),
                                                                     ("p/b.md", "text")}
    assert counts["documents"] == 2


def test_a_broken_member_is_counted_and_the_others_are_read(tmp_path):
    data = bytearray(_zip({"a/first.py": CODE * 20, "a/second.py": CODE}))
    start = data.index(b"a/first.py") + len(b"a/first.py")  # the first member's deflated bytes follow its name
    data[start + 10:start + 40] = bytes(30)
    (tmp_path / "z.zip").write_bytes(bytes(data))
    pieces, _ = _read(tmp_path / "z.zip")
    assert [(x.file.rsplit("!", 1)[1], x.reason) for x in pieces] == [("a/first.py", "unreadable"),
                                                                       ("a/second.py", None)]


@pytest.mark.parametrize("pattern", ["", "/", "/**", "/**/*.py", "/*.py", "/sub*", "/sub*/", "/sub1/deep/x.py",
                                     "/[st]*/*.txt"])
def test_a_corpus_uri_names_the_files_its_local_path_names(tmp_path, pattern):
    """The same directory, file or glob as a local path and as a filesystem URI: the same files
    (the glob read as Python's recursive glob reads it, a directory it matches taken whole)."""
    from leakray.screen.corpus import plan_corpus

    root = tmp_path / "c"
    for rel in ("a.py", "b.txt", "sub1/c.py", "sub1/deep/x.py", "sub2/d.txt", "top.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n" + "x = 1\n" * 5)

    def files(spec, strip=""):
        plan = plan_corpus(spec, 1 << 20)
        return sorted(p[len(strip):] for p, _ in plan.files + plan.shards)

    local = files(f"{root}{pattern}")
    assert local and files(f"file://{root}{pattern}", "file://") == local
