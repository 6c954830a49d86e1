"""Screening: near-duplicate search of benchmark samples in a readable corpus (LessLeak-Bench's
leakage ratio; every benchmark indexed once, one corpus pass, exact candidates and verification).

Modules (plain Python on batches; Ray only in `leakray.executor.screen`):

- `parts`      a sample's screened parts (prompt, solution, tests, task) -> index entries
- `shingle`    code tokenizer (regex rule, numpy form; escapes as whitespace) -> distinct 48-bit shingles,
               and the values of token runs
- `rarity`     which shingles are common in code (evidence needs rare ones)
- `minhash`    signatures, bit-compatible with datasketch's "affine32" scheme (the estimate per pair)
- `candidates` sorted-key probe, a byte-table prefilter, and the token-run probe
- `index`      `ScreenConfig` and `BenchmarkIndex` (shingle sets, rare-shingle candidate index,
               token-run index of tests, token sequences); numpy only, shared once through the object store
- `verify`     exact |sample ∩ text|, and the aligned span check that tells a copy from chance
- `formats`    which reader a file gets (extension under .gz/.zst/.bz2/.xz, else sniffed)
- `readers`    files -> texts with provenance (file, record, key, line): code, text, markdown,
               notebooks, JSON, JSONL, parquet, Arrow
- `corpus`     PATH_OR_GLOB -> files to read; every file screened or counted skipped with a reason
- `screener`   one corpus batch -> verified pairs + counters (files, documents, texts)
- `outputs`    pairs.parquet, summary.json, labels.csv, clean/<name>/<file>, _SUCCESS (run key)
- `driver`     a screen's parts, engine-agnostic (run as stages by `leakray.protocols.screen`;
               the command is `leakray.commands.screen`, also `jobs/screen.py` for `ray job submit`)

A pair (sample part, corpus text) is reported when the text holds at least `min_rare_shingles`
of the part's rare shingles (`index`) and exact Jaccard >= threshold, or exact containment
|part ∩ text| / |part| >= containment with a share of the rare shingles and the part's tokens in
aligned runs (`verify`); tests with too few rare shingles give their number-bearing token runs
as that evidence instead. Both measures, the evidence, the span coverage, the MinHash estimate
and where the copy is are written for every pair (column names: `leakray.schema.P`).
"""
