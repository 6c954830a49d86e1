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


_WORDS = ("total", "items", "value", "result", "index", "count", "name", "data", "key", "acc", "left", "right")
_OPS = ("+", "-", "*", "//", "%", "max", "min", "len", "sorted", "sum")


def _body(rng, n_lines):
    lines = []
    for _ in range(n_lines):
        a, b, c = rng.choice(_WORDS, 3)
        op = rng.choice(_OPS)
        lines.append(f"    {a} = {op}({b}, {c})" if op.isalpha() else f"    {a} = {b} {op} {c}")
    return "\n".join(lines) + f"\n    return {rng.choice(_WORDS)}\n"


def rich_collection(n=160, k=5, d=16, seed=0, prefix="t", signal=1.0, shuffle_labels=False, **kw):
    """``synthetic_collection`` plus every column the registry's detectors read, each with
    membership planted (``signal`` 0 = none) so that each detector's own statistic
    separates members: prompts and references, completions (members: near-copies of the
    reference continuation, so the samples agree with each other), per-token reference
    log-probabilities with vocabulary mean/std and ranks (members: likelier, top-ranked
    tokens, also relative to a reference model that never saw them), and perplexities of
    upper-cased-prompt completions (members: a larger rise). ``shuffle_labels`` then
    permutes the member column, which keeps the features and breaks every link to them."""
    # synthetic_collection's own columns get its default signal (0.5) at signal=1
    table = synthetic_collection(n=n, k=k, d=d, seed=seed, prefix=prefix, signal=0.5 * signal, **kw)
    rng = np.random.default_rng(seed + 1000)
    member = table.column(C.MEMBER).to_numpy().astype(bool)
    s = float(signal)
    prompts, refs, comps, lps, mus, sigmas, ranks, refmodel, upper = [], [], [], [], [], [], [], [], []
    ppl = np.asarray(table.column(C.PERPLEXITY).to_pylist())
    for i in range(n):
        prompt = f"def f{i}({rng.choice(_WORDS)}, {rng.choice(_WORDS)}):\n"
        body = _body(rng, int(rng.integers(3, 7)))
        prompts.append(prompt)
        refs.append(prompt + body)
        if member[i] and rng.random() < s:
            # near-copies of the reference body: one token changed at most
            comps.append([body if rng.random() < 0.7 else body.replace("=", "==", 1) for _ in range(k)])
        else:
            comps.append([_body(rng, int(rng.integers(3, 7))) for _ in range(k)])
        length = int(rng.integers(15, 40))
        difficulty = rng.uniform(1.0, 2.0)  # per-text ease any model sees
        base = -rng.exponential(difficulty, length)
        lp = base * (1 - 0.5 * s * member[i])  # members: the same text, half the surprise
        lps.append(lp.tolist())
        refmodel.append((base + rng.normal(0, 0.05, length)).tolist())
        mus.append((np.full(length, -8.0) + rng.normal(0, 0.3, length)).tolist())
        sigmas.append(rng.uniform(1.5, 2.5, length).tolist())
        p0 = 0.2 + 0.6 * s * member[i]
        ranks.append(np.where(rng.random(length) < p0, 0, rng.geometric(0.05, length)).tolist())
        rise = 0.6 * s * member[i] + rng.normal(0, 0.15, k)
        upper.append((ppl[i] * np.exp(rise)).tolist())
    # the prompt's own log-probability (own generator: the columns above keep their values)
    rng_p = np.random.default_rng(seed + 3000)
    p_base = np.array([-rng_p.exponential(rng_p.uniform(1.0, 2.0), 20).sum() for _ in range(n)])
    prompt_lp = p_base * (1 - 0.5 * s * member)
    refmodel_prompt_lp = p_base + rng_p.normal(0, 0.2, n)
    sch = collection_schema()
    extra = {C.PROMPT_LOGPROB: prompt_lp.tolist(), C.REFMODEL_PROMPT_LOGPROB: refmodel_prompt_lp.tolist(),
             C.PROMPT: prompts, C.REFERENCE: refs, C.COMPLETIONS: comps, C.REF_TOKEN_LOGPROBS: lps,
             C.REF_TOKEN_MU: mus, C.REF_TOKEN_SIGMA: sigmas, C.REF_TOKEN_RANK: ranks,
             C.REFMODEL_TOKEN_LOGPROBS: refmodel, C.UPPER_PERPLEXITY: upper}
    for name, values in extra.items():
        table = table.append_column(sch.field(name), pa.array(values, sch.field(name).type))
    if shuffle_labels:
        perm = np.random.default_rng(seed + 2000).permutation(member.astype(np.int8))
        table = table.set_column(table.schema.get_field_index(C.MEMBER), sch.field(C.MEMBER),
                                 pa.array(perm, pa.int8()))
    return table
