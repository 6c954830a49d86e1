"""Screening: near-duplicate search of benchmark samples in a readable corpus (LessLeak-Bench's
MinHash + LSH, indexed once for all benchmarks, one corpus pass, plus exact containment).

Modules (plain Python on batches; Ray only in `leakray.pipelines.screen`):

- `shingle`   code tokenizer (regex rule, numpy form) -> distinct 64-bit n-gram shingle hashes
- `minhash`   signatures, bit-compatible with datasketch's "affine32" scheme (seeded, recorded)
- `lsh`       datasketch's optimal (bands, rows); band keys in one sorted array; vectorised probe
- `index`     `ScreenConfig` and `BenchmarkIndex` (shingle sets, signatures, bands, containment
              prefix-filter index); numpy only, shared once through the object store
- `verify`    exact |sample ∩ file| on the same shingle hashes that were MinHashed
- `screener`  one corpus batch -> verified pairs + counters; corpus kinds files / jsonl / parquet
- `corpus`    PATH_OR_GLOB -> files and shards; bad files counted under a reason, never fatal
- `outputs`   pairs.parquet, summary.json, labels.csv, clean/<name>/<file>, _SUCCESS (run key)
- `cli`       `leakray screen` (also `jobs/screen.py` for `ray job submit`)

A pair is reported when exact Jaccard >= threshold (candidates from LSH, files whose shingle
count cannot reach the threshold with any sample are not even signed) or exact containment
|sample ∩ file| / |sample| >= containment (candidates from the prefix filter, which misses no
pair above the threshold); both measures and the MinHash estimate are written for every pair.
"""
