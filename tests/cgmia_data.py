"""Tiny synthetic collections with a planted membership signal (shared by CGMIA tests)."""

import numpy as np
import pyarrow as pa

from leakray.schema import C, collection_schema


def synthetic_collection(n=160, k=5, d=16, seed=0, has_tests=True, signal=0.5, prefix="t",
                         embed_signal=None, embed_shift=0.0, member_share=0.5):
    """``signal`` plants membership in the expert features and (unless ``embed_signal``
    says otherwise) in how close completions' embeddings are to the reference's;
    ``embed_shift`` moves members' reference and completion embeddings along a fixed
    direction (a signal only the embedding blocks can see); ``member_share`` of the rows
    are members. Defaults reproduce the original collections exactly."""
    rng = np.random.default_rng(seed)
    embed_signal = signal if embed_signal is None else embed_signal
    if member_share == 0.5:
        member = (np.arange(n) % 2).astype(np.int8)
    else:
        member = (np.arange(n) < round(member_share * n)).astype(np.int8)
    rng.shuffle(member)
    m = member[:, None].astype(float)
    # members: lower perplexity, higher CodeBLEU, lower edit distance, pass more often
    ppl = np.exp(rng.normal(1.0 - 0.6 * signal * m, 0.35, (n, k)))
    cb = np.clip(rng.normal(0.4 + 0.25 * signal * m, 0.12, (n, k)), 0, 1)
    ed = np.clip(rng.normal(0.6 - 0.25 * signal * m, 0.12, (n, k)), 0, 1)
    passed = rng.random((n, k)) < (0.3 + 0.3 * signal * m)
    if not has_tests:
        passed[:] = False
    ref = rng.normal(size=(n, d)) + embed_shift * m / np.sqrt(d)
    gen = ref[:, None, :] * (0.3 + 0.4 * embed_signal * m[:, :, None]) + rng.normal(size=(n, k, d))
    expert = np.concatenate([ppl, cb, ed, passed.astype(float)], axis=1)
    sch = collection_schema()
    cols = {
        C.TASK_ID: [f"{prefix}{i}" for i in range(n)],
        C.MEMBER: member,
        C.PERPLEXITY: ppl.tolist(),
        C.PASSED: passed.tolist(),
        C.HAS_TESTS: [has_tests] * n,
        C.CODEBLEU: cb.tolist(),
        C.EDIT_DISTANCE: ed.tolist(),
        C.EXPERT: expert.tolist(),
        C.GEN_EMBEDDING: gen.reshape(n, k * d).tolist(),
        C.REF_EMBEDDING: ref.tolist(),
        C.REF_LOSS: (np.log(ppl).mean(1) + rng.normal(0, 0.1, n)).tolist(),
    }
    return pa.table({c: pa.array(v, sch.field(c).type) for c, v in cols.items()})
