"""Screening stage without Ray: shingles, MinHash, LSH, containment, verification, corpus, outputs, CLI."""

from __future__ import annotations

import csv
import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from leakray.screen import corpus as C
from leakray.screen.candidates import expand_matches
from leakray.schema import P
from leakray.screen.index import BenchmarkIndex, ScreenConfig
from leakray.screen.minhash import MinHasher
from leakray.screen.screener import BatchScreener, Stats, screen_documents
from leakray.screen.shingle import TOKENIZER_NAME, shingle_batch, shingles_reference, token_sequence, tokenize
from leakray.screen.verify import jaccard_exact

FIX = Path(__file__).parent / "fixtures" / "screen"
HE, MBPP, CORPUS = FIX / "humaneval.jsonl", FIX / "mbpp.jsonl", FIX / "corpus"

SNIPPETS = [
    "def f(a, b):\n    return a==b  # café\n",
    "for i in range(10):\n\tprint(i ** 2, end='')\n",
    "x=1;y=2\nz = x+y\n",
    "",
    "one",
    "@decorator\nclass Ünïcode(Base):\n    def méthode(self): return self.x->y\n",
    "a\x0bb\x0cc\rd",
    "a_very_long_identifier_name_one = another_long_identifier_x + a_very_long_identifier_xame_one\n" * 2,
    "abcdefgh abcdefghi abcdefghijklmnop abcdefghijklmnopq abcdefghijklmnopr abcdefgh_\n",
]


def _mutate(text: str, rng: random.Random, rate: float) -> str:
    toks = text.split(" ")
    for i in range(len(toks)):
        if rng.random() < rate:
            toks[i] = f"v{rng.randrange(10**6)}"
    return " ".join(toks)


def _random_code(rng: random.Random, n_lines: int) -> str:
    words = ["if", "x", "y", "return", "for", "in", "range", "len", "self", "data", "=", "+", "(", ")", ":"]
    return "\n".join(" ".join(rng.choice(words) + str(rng.randrange(50)) for _ in range(8)) for _ in range(n_lines))


def _code_with_names(rng: random.Random, n_lines: int) -> tuple[str, list[str]]:
    """Code whose only rare tokens are a few names (the shape of a real function)."""
    names = [f"n{rng.randrange(10**6)}" for _ in range(6)]
    lines = ["    if x[i] > {a} and y[j] < 0:", "        return {a} + len(x) * 2", "    for i in range(len(x) - 1):",
             "    y[i] = y[i - 1] + x[i] * 2", "    while x and not {a}:", "    return (x, y, {a})",
             "    z = [v for v in x if v % 2 == 0]"]
    return "\n".join(rng.choice(lines).format(a=rng.choice(names)) for _ in range(n_lines)), names


# ---------------------------------------------------------------- shingles


def test_tokenizer_splits_code():
    assert tokenize("a==b") == tokenize("a == b") == [b"a", b"=", b"=", b"b"]
    assert tokenize("x1_y.z(3.5)") == [b"x1_y", b".", b"z", b"(", b"3", b".", b"5", b")"]
    assert tokenize("café") == ["café".encode()]


@pytest.mark.parametrize("ngram", [1, 2, 3, 5])
def test_vectorised_shingles_match_reference(ngram):
    texts = SNIPPETS + [_random_code(random.Random(i), 30) for i in range(5)]
    for chunk in (1 << 20, 50):  # one chunk, and chunks split between documents
        sets = shingle_batch(texts, ngram, chunk_bytes=chunk)
        assert len(sets) == len(texts)
        ref = [shingles_reference(t, ngram) for t in texts]
        assert [len(r) for r in ref] == sets.sizes.tolist()
        for i in range(len(texts)):
            for j in range(len(texts)):
                union = len(ref[i] | ref[j])
                want = len(ref[i] & ref[j]) / union if union else 0.0
                assert jaccard_exact(sets[i], sets[j]) == pytest.approx(want)


def test_shingle_hashes_are_stable_across_processes():
    code = ("from leakray.screen.shingle import shingle_batch;"
            "print(shingle_batch(['def f(a):\\n    return a + 1\\n'], 2).values.tolist())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    here = shingle_batch(["def f(a):\n    return a + 1\n"], 2).values.tolist()
    assert json.loads(outs.pop()) == here
    # pinned: a change of tokenizer or hash must bump TOKENIZER_NAME and this value
    assert (TOKENIZER_NAME, here[0]) == ("code-bytes-v3", 6407484938239)


def _token_value(tok: bytes) -> int:
    """The token value as `token_hashes` defines it, one token at a time in plain Python."""
    mask = (1 << 64) - 1

    def fmix(h):
        for mul in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
            h = ((h ^ (h >> 33)) * mul) & mask
        return h ^ (h >> 33)

    h = int.from_bytes(tok[:8], "little")
    if len(tok) > 8:
        h ^= fmix(int.from_bytes(tok[-8:], "little") ^ (len(tok) * 0x9E3779B97F4A7C15 & mask))
        for k in range(1, (len(tok) + 7) // 8 - 1):
            h ^= fmix(int.from_bytes(tok[8 * k:8 * k + 8], "little") ^ (k * 0x632BE59BD9B4E019 & mask))
    return h


def test_token_values_match_their_definition():
    """Every byte of a token counts, for each length the vectorised paths treat apart (1-8,
    9-16, longer), and tokens differing in one middle byte differ."""
    rng = random.Random(5)
    alphabet = "abcdefghijklmnopqrstuvwxyz_0123456789é"
    words = ["".join(rng.choice(alphabet) for _ in range(n)) for n in list(range(1, 41)) + [64, 65, 200]]
    words += [w[:len(w) // 2] + "Q" + w[len(w) // 2 + 1:] for w in words if len(w) > 2]
    text = " ".join(words) + " (x)==y; \\n"
    toks = tokenize(text)
    th, starts = token_sequence(text)
    assert [_token_value(t) for t in toks] == th.tolist()
    assert len(set(th.tolist())) == len(set(toks))


# ---------------------------------------------------------------- MinHash / LSH


def test_minhash_equals_datasketch_affine32():
    from datasketch import MinHash

    texts = SNIPPETS + ["z " * 5000 + "q"]
    sets = shingle_batch(texts, 2)
    mh = MinHasher(num_perm=128, seed=42, block_rows=64)  # small blocks: exercise the split paths
    sigs = mh.signatures(sets)
    for i in range(len(texts)):
        ref = MinHash(num_perm=128, seed=42, hashfunc=lambda v: v, scheme="affine32")
        ref.update_batch([int(v) & 0xFFFFFFFF for v in sets[i]])
        assert (ref.hashvalues == sigs[i]).all()
    assert (mh.signatures(sets, [3, 0]) == sigs[[3, 0]]).all()


def test_expand_matches_counts_distinct_hits():
    keys = np.array([5, 5, 7, 9], dtype=np.uint64)
    owner = np.array([0, 1, 1, 2])
    q = np.array([5, 7, 9, 9, 1], dtype=np.uint64)
    rows = np.array([0, 0, 0, 1, 1])
    f, e, n = expand_matches(keys, owner, q, rows)
    assert set(zip(f.tolist(), e.tolist(), n.tolist())) == {(0, 0, 1), (0, 1, 2), (0, 2, 1), (1, 2, 1)}
    f, e, n = expand_matches(keys, owner, q, rows, min_hits=np.array([1, 2, 2]))
    assert set(zip(f.tolist(), e.tolist())) == {(0, 0), (0, 1)}


# ---------------------------------------------------------------- screening


def test_candidates_are_exact_for_the_reporting_rule():
    """Every pair the rule admits is a candidate: Jaccard >= 0.7 with at least min_rare_shingles
    rare shingles shared, or containment >= 0.8 with 70% of the sample's rare shingles too.
    Brute force over random texts agrees with the indexed filter, including near-duplicates
    whose renamed tokens (the rare ones) leave fewer than 70% of the rare shingles."""
    rng = random.Random(11)
    samples = [_random_code(rng, rng.randrange(3, 10)) for _ in range(40)]
    named = [_code_with_names(rng, 12) for _ in range(20)]
    samples += [text for text, _ in named]
    cfg = ScreenConfig(span_coverage=0.0)
    index = BenchmarkIndex(cfg, samples)
    docs = [_mutate(samples[i % 40], rng, 0.15) + "\n" + _random_code(rng, rng.randrange(1, 30)) for i in range(120)]
    docs += [text.replace(names[0], "renamed_x").replace(names[1], "renamed_y") for text, names in named]
    files = shingle_batch(docs)
    got = {(p[P.CORPUS_ID], p["entry"]) for p in screen_documents(index, [str(i) for i in range(len(docs))],
                                                                  [d.encode() for d in docs])}
    keys = set(index.keys.tolist())
    want, jaccard_only_below_share = set(), 0
    for f in range(len(docs)):
        for e in np.flatnonzero(index.screenable):
            inter = np.intersect1d(files[f], index.sets[e])
            rare = sum(1 for v in inter.tolist() if v in keys and e in index.owner[index.keys == v])
            jac = len(inter) / (len(files[f]) + index.sizes[e] - len(inter))
            con = len(inter) / index.sizes[e]
            share_ok = rare >= max(4, np.ceil(0.7 * index.rare[e] - 1e-9))
            by_jaccard = jac >= 0.7 and rare >= 4
            if by_jaccard or (index.contain_ok[e] and con >= 0.8 and share_ok):
                want.add((str(f), int(e)))
                jaccard_only_below_share += by_jaccard and not share_ok
    assert want and got == want
    assert jaccard_only_below_share  # the case the rare-share rule used to drop


def test_screen_finds_planted_pairs_and_nothing_below_thresholds():
    rng = random.Random(7)
    samples = [_random_code(rng, rng.randrange(3, 12)) for _ in range(60)]
    cfg = ScreenConfig(threshold=0.7, containment=0.8, min_containment_shingles=16)
    index = BenchmarkIndex(cfg, samples)
    docs, ids = [], []
    for i, s in enumerate(samples[:30]):
        docs.append(_mutate(s, rng, 0.03))
        ids.append(f"near{i}")
        docs.append(_random_code(rng, 40) + "\n" + s + "\n" + _random_code(rng, 40))  # s inside a big file
        ids.append(f"inside{i}")
    docs += [_random_code(rng, 10) for _ in range(40)]
    ids += [f"noise{i}" for i in range(40)]
    pairs = screen_documents(index, ids, [d.encode() for d in docs], Stats())
    sets, files = index.sets, shingle_batch(docs)
    # brute force ground truth on the same shingles
    truth = set()
    for f in range(len(docs)):
        for e in range(len(samples)):
            inter = len(np.intersect1d(files[f], sets[e]))
            jac = inter / (len(files[f]) + len(sets[e]) - inter)
            con = inter / len(sets[e])
            if index.screenable[e] and (jac >= 0.9 or (index.contain_ok[e] and con >= 0.8)):
                truth.add((ids[f], e))
    got = {(p[P.CORPUS_ID], p["entry"]) for p in pairs}
    assert truth <= got  # containment is exact; J >= 0.9 is far above the LSH knee (miss < 1e-4)
    for p in pairs:
        f = ids.index(p[P.CORPUS_ID])
        e = p["entry"]
        assert p[P.JACCARD] == pytest.approx(jaccard_exact(files[f], sets[e]))
        assert p[P.JACCARD] >= 0.7 or (index.contain_ok[e] and p[P.CONTAINMENT] >= 0.8)
        assert 0.0 <= p[P.EST_JACCARD] <= 1.0
    inside = [p for p in pairs if p[P.CORPUS_ID].startswith("inside")]
    assert inside and all(p[P.CONTAINMENT] == 1.0 and p[P.JACCARD] < 0.7 for p in inside
                          if p[P.CORPUS_ID] == f"inside{p['entry']}")


def test_containment_off_and_generic_samples():
    text = "def tiny_helper(values):\n    return values_total + 1\n"
    big = _random_code(random.Random(1), 50) + "\n" + text
    on = BenchmarkIndex(ScreenConfig(min_containment_shingles=4), [text])
    off = BenchmarkIndex(ScreenConfig(containment=0.0), [text])
    assert screen_documents(on, ["big"], [big.encode()])
    assert not screen_documents(off, ["big"], [big.encode()])
    assert screen_documents(off, ["same"], [text.encode()])[0][P.JACCARD] == 1.0
    generic = "def f(a):\n    return a + 1\n"  # every token common in code: too generic to screen
    index = BenchmarkIndex(ScreenConfig(), [generic])
    assert not index.screenable[0] and not screen_documents(index, ["same"], [generic.encode()])


# ---------------------------------------------------------------- corpus


def test_check_bytes_reasons():
    assert C.check_bytes(b"", 10) == "empty"
    assert C.check_bytes(b" \n\t", 10) == "empty"
    assert C.check_bytes(b"ab\x00c", 10) == "binary"
    assert C.check_bytes("café".encode("latin-1"), 10) == "undecodable"
    assert C.check_bytes(b"x" * 11, 10) == "huge"
    assert C.check_bytes(b"x = 1", 10) is None


def test_plan_corpus_directory_and_glob(tmp_path):
    plan = C.plan_corpus(str(CORPUS), max_file_bytes=1000)
    names = sorted(os.path.basename(p) for p, _ in plan.files)
    assert "notes.txt" in names and "copy_he0.py" in names and "bank.py" in names  # text is read too
    assert plan.skipped["empty"] == 1  # empty.py (blank.py has bytes; found when read)
    assert plan.skipped["huge"] == 1  # strings_util.py is over 1000 bytes
    assert plan.n_files == sum(len(f) for _, _, f in os.walk(CORPUS))
    both = C.plan_corpus(str(CORPUS) + "/*", max_file_bytes=1000)  # the pkg dir and its files, once each
    assert sorted(both.files) == sorted(plan.files)
    plan = C.plan_corpus(str(FIX / "*.jsonl"), max_file_bytes=1000)
    assert sorted(os.path.basename(p) for p, _ in plan.shards) == ["corpus.jsonl", "humaneval.jsonl", "mbpp.jsonl"]
    with pytest.raises(Exception, match="no corpus file"):
        C.plan_corpus(str(tmp_path / "nothing*.parquet"), 1000)


def test_batch_screener_counts_bad_inputs(tmp_path):
    code = "def add_numbers(first_value, second_value):\n    return first_value + second_value\n"
    index = BenchmarkIndex(ScreenConfig(), [code])
    files = BatchScreener(index, "files")
    paths = [str(p) for p in sorted(CORPUS.rglob("*.py"))] + [str(tmp_path / "gone.py")]
    pairs, st = files({"path": paths})
    assert st["files_in"] == len(paths)
    for reason in ("empty", "binary", "undecodable", "unreadable"):
        assert st["files_skipped:" + reason] >= 1, reason
    assert st["files_screened"] + sum(st.skipped("files").values()) == len(paths)
    gz = tmp_path / "c.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(json.dumps({"id": "a", "content": code}) + "\n{bad\n")
    pairs, st = files({"path": [str(gz), str(tmp_path / "gone.jsonl")]})
    assert [p[P.CORPUS_ID] for p in pairs] == [f"{gz}:1#content"]
    assert st["texts_skipped:malformed"] == 1 and st["files_skipped:unreadable"] == 1 and st["documents"] == 2
    shard, broken, no_text = tmp_path / "s.parquet", tmp_path / "broken.parquet", tmp_path / "n.parquet"
    pq.write_table(pa.table({"content": [code, None], "path": ["r/x.py", "r/y.py"]}), shard)
    broken.write_bytes(b"PAR1 not really")
    pq.write_table(pa.table({"n": [1]}), no_text)
    pairs, st = files({"path": [str(shard), str(broken), str(no_text)]})
    assert [(p[P.CORPUS_RECORD], p[P.CORPUS_KEY]) for p in pairs] == [(0, "content")]
    assert (st["files_skipped:no_text_column"], st["files_skipped:unreadable"]) == (1, 1)
    pairs, st = BatchScreener(index, "records")({"content": [code, None, b"\x00"]})
    assert pairs[0][P.CORPUS_ID].startswith("sha1:")
    assert st["texts_skipped:no_content"] == 1 and st["texts_skipped:binary"] == 1


# ---------------------------------------------------------------- end to end (no Ray)


def _run_cli(*extra):
    from leakray.cli import main

    return main(["screen", "--benchmark", f"humaneval={HE}", "--benchmark", f"mbpp={MBPP}", *extra,
                 "--engine", "local"])


def test_cli_local_run_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    assert _run_cli("--corpus", str(CORPUS), "--output", str(out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    he, mb = summary["benchmarks"]["humaneval"], summary["benchmarks"]["mbpp"]
    assert (he["n_samples"], he["n_leaked"], he["ratio"]) == (4, 2, 0.5)
    assert he["leaked_task_ids"] == ["HumanEval/0", "HumanEval/2"]  # exact copy (and in notes.txt), renamed copy
    assert he["documents_per_task"] == {"HumanEval/0": 2, "HumanEval/2": 1}
    assert mb["leaked_task_ids"] == ["MBPP/11"]  # contained in a larger module
    assert summary["corpus"]["files"]["skipped"] == {"binary": 1, "empty": 2, "undecodable": 1}
    assert summary["corpus"]["files"]["in"] == 9 and summary["corpus"]["files"]["accounted"]
    cfg = summary["config"]
    assert (cfg["seed"], cfg["num_perm"], cfg["ngram"], cfg["parts"]) == (1, 256, 2, ["prompt", "solution", "tests",
                                                                                       "task"])
    pairs = pq.read_table(out / "pairs.parquet").to_pylist()
    assert {(p[P.TASK_ID], os.path.basename(p[P.CORPUS_ID])) for p in pairs} == {
        ("HumanEval/0", "copy_he0.py"), ("HumanEval/0", "notes.txt"), ("HumanEval/2", "bank.py"),
        ("MBPP/11", "strings_util.py")}
    mbpp_pair = next(p for p in pairs if p[P.TASK_ID] == "MBPP/11")
    assert mbpp_pair[P.PART] == "solution" and mbpp_pair[P.CONTAINMENT] == 1.0 and mbpp_pair[P.JACCARD] < 0.2
    assert mbpp_pair[P.LINE_START] > 1 and mbpp_pair[P.LINE_END] - mbpp_pair[P.LINE_START] == 9
    with open(out / "labels.csv", newline="", encoding="utf-8") as fh:
        sheet = list(csv.DictReader(fh))
    assert len(sheet) == len(pairs) and all(r[P.LABEL] == "" and r[P.SAMPLE_TEXT] and r[P.CORPUS_TEXT] for r in sheet)
    clean_he = [json.loads(line)["task_id"] for line in (out / "clean/humaneval/humaneval.jsonl").open()]
    assert clean_he == ["HumanEval/1", "HumanEval/3"]
    clean_mb = [json.loads(line)["task_id"] for line in (out / "clean/mbpp/mbpp.jsonl").open()]
    assert clean_mb == [12, 13]
    assert (out / "_SUCCESS").exists()
    # rerun with the same inputs: skipped
    capsys.readouterr()
    mtime = (out / "pairs.parquet").stat().st_mtime_ns
    assert _run_cli("--corpus", str(CORPUS), "--output", str(out)) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert (out / "pairs.parquet").stat().st_mtime_ns == mtime
    # another config is another run
    assert _run_cli("--corpus", str(CORPUS), "--output", str(out), "--containment", "0", "--parts", "solution") == 0
    assert json.loads((out / "summary.json").read_text())["benchmarks"]["mbpp"]["n_leaked"] == 0


def test_screen_killed_mid_run_resumes_at_its_stage(tmp_path):
    # the same stages and markers as every protocol: a driver killed (SIGKILL) while writing the
    # outputs resumes there, without a second corpus pass
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "leakray.cli", "screen", "--benchmark", f"humaneval={HE}", "--corpus", str(CORPUS),
           "--output", str(out), "--engine", "local"]
    env = {**os.environ, "LEAKRAY_KILL_IN_STAGE": "outputs"}
    assert subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300).returncode == -9
    done = (out / "corpus_pass" / "_DONE.json").stat().st_mtime_ns
    assert not (out / "outputs" / "_DONE.json").exists() and not (out / "summary.json").exists()
    env.pop("LEAKRAY_KILL_IN_STAGE")
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "corpus_pass: already done" in resumed.stderr
    assert (out / "corpus_pass" / "_DONE.json").stat().st_mtime_ns == done
    # the corpus pass says where its time went, as every protocol's stages do (leakray.parts)
    marker = json.loads((out / "corpus_pass" / "_DONE.json").read_text())
    assert marker["part_seconds"]["screen"] > 0 and marker["throughput"]["files_screened_per_s"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmarks"]["humaneval"]["leaked_task_ids"] == ["HumanEval/0", "HumanEval/2"]


def test_clean_export_keeps_format_for_json_and_parquet(tmp_path):
    recs = [json.loads(line) for line in HE.open()]
    as_json, as_parquet = tmp_path / "he.json", tmp_path / "he.parquet"
    as_json.write_text(json.dumps(recs))
    pq.write_table(pa.Table.from_pylist(recs), as_parquet)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"path": "x/copy.py", "content": recs[1]["prompt"] + recs[1]["canonical_solution"]})
                      + "\n")
    from leakray.cli import main

    out = tmp_path / "run"
    assert main(["screen", "--benchmark", f"a={as_json}", "--benchmark", f"b={as_parquet}", "--corpus", str(corpus),
                 "--output", str(out), "--engine", "local", "--parts", "prompt,solution"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["benchmarks"]["a"]["leaked_task_ids"] == ["HumanEval/1"]
    assert summary["config"]["parts"] == ["prompt", "solution"]
    assert [r["task_id"] for r in json.loads((out / "clean/a/he.json").read_text())] == [
        "HumanEval/0", "HumanEval/2", "HumanEval/3"]
    assert pq.read_table(out / "clean/b/he.parquet").column("task_id").to_pylist() == [
        "HumanEval/0", "HumanEval/2", "HumanEval/3"]
    fields = {p[P.FIELD] for p in pq.read_table(out / "pairs.parquet").to_pylist()}
    assert "prompt" in fields and fields <= {"solution", "prompt"}  # only the parts asked for


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    from leakray.cli import main

    with pytest.raises(SystemExit):
        main(["screen", "--benchmark", "nopath", "--corpus", "x", "--output", "y"])
    assert main(["screen", "--benchmark", f"h={HE}", "--corpus", str(tmp_path / "none*"), "--output",
                 str(tmp_path / "o"), "--engine", "local"]) == 2
    assert main(["screen", "--benchmark", f"h={HE}", "--corpus", str(CORPUS), "--output", str(tmp_path / "o"),
                 "--threshold", "1.5", "--engine", "local"]) == 2
    capsys.readouterr()
    # a benchmark file that is not there: one line, not a traceback
    assert main(["screen", "--benchmark", f"h={tmp_path / 'missing.jsonl'}", "--corpus", str(CORPUS), "--output",
                 str(tmp_path / "o"), "--engine", "local"]) == 2
    assert "benchmark 'h': no such file" in capsys.readouterr().err
    # a mistyped corpus directory under a recursive glob (Python's glob returns "missing/" for "missing/**")
    assert main(["screen", "--benchmark", f"h={HE}", "--corpus", str(tmp_path / "missing" / "**"), "--output",
                 str(tmp_path / "o"), "--engine", "local"]) == 2
    assert "no corpus file matches" in capsys.readouterr().err
    # a corpus of which nothing can be screened: refused, not "0% leaked"
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.bin").write_bytes(bytes(range(256)))
    (junk / "empty.py").write_text("")
    assert main(["screen", "--benchmark", f"h={HE}", "--corpus", str(junk), "--output", str(tmp_path / "o"),
                 "--engine", "local"]) == 2
    err = capsys.readouterr().err
    assert "nothing in the corpus can be screened: 2 files, every one skipped (binary 1, empty 1;" in err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_corpus_that_gave_no_text_says_its_ratios_mean_nothing(tmp_path, capsys):
    from leakray.cli import main

    corpus = tmp_path / "numbers"
    corpus.mkdir()
    (corpus / "n.jsonl").write_text("".join(json.dumps({"a": i}) + "\n" for i in range(5)))  # records, no text
    assert main(["screen", "--benchmark", f"h={HE}", "--corpus", str(corpus), "--output", str(tmp_path / "o"),
                 "--engine", "local"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "0 texts screened" in last and "WARNING: no corpus text was screened" in last
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["warnings"] == ["no corpus text was screened, so these ratios say nothing about leakage"]
    assert main(["screen", "--benchmark", f"h={HE}", "--corpus", str(CORPUS), "--output", str(tmp_path / "o2"),
                 "--engine", "local"]) == 0
    assert "WARNING" not in capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads((tmp_path / "o2" / "summary.json").read_text())["warnings"] == []


def test_export_problem_is_recorded_not_fatal(tmp_path):
    from leakray.screen import outputs as O
    from leakray.screen.parts import Entries

    odd = tmp_path / "bench.csv"
    odd.write_text("task_id\nX/1\n")
    entries = Entries()
    entries.benchmark, entries.task_id, entries.field = ["b"], ["X/1"], ["reference"]
    entries.text, entries.source_row = ["def f(): pass"], [1]
    pair = {"entry": 0, P.CORPUS_ID: "c.py", P.EST_JACCARD: 1.0, P.JACCARD: 1.0, P.CONTAINMENT: 1.0,
            P.SAMPLE_SHINGLES: 5, P.CORPUS_SHINGLES: 5, P.SHARED_SHINGLES: 5, P.CORPUS_TEXT: "def f(): pass",
            P.LINE_START: 1, P.LINE_END: 1, P.SPAN_COVERAGE: 1.0}
    summary = O.write_outputs(tmp_path / "run", key="k", entries=entries, pairs=[pair], benchmarks=[("b", str(odd))],
                              n_tasks={"b": 1}, corpus_stats={}, config_record={}, seconds=0.0)
    assert summary["benchmarks"]["b"]["n_leaked"] == 1
    assert summary["benchmarks"]["b"]["clean_export"] is None and "format" in summary["benchmarks"]["b"][
        "clean_export_error"]
    assert O.finished(tmp_path / "run", "k") and not O.finished(tmp_path / "run", "other")
