"""The `pretrain-mix` leak: continue pretraining a base model on a clean code corpus with the
member tasks inserted d times each (issue 9), so a leak looks like real contamination.

- `corpus`    clean corpus from installed site-packages source, deduplicated and screened
              against the benchmark with leakray's own screener (cached across doses and runs)
- `mixture`   `MixConfig`; the token stream: clean documents + each member exactly `dose` times
- `pretrain`  continued pretraining on the mixture's sequences (plain torch, Ray-Train-friendly)

Ray only in `leakray.executor.leak_train`.
"""
