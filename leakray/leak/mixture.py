"""The `pretrain-mix` token stream: clean documents with each member inserted exactly `dose`
times, whole, at random document boundaries, EOS-separated, cut into training sequences.

A member copy that fits in one sequence never straddles two: when it would, the rest of the
current sequence is filled with the clean text that follows, so the copy starts a sequence
(as a benchmark sample is scored: from its first token, no context). Copies longer than a
sequence straddle unavoidably and are counted. Non-members are never written.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

import numpy as np

from leakray.errors import BadInput


# models.finetune.FinetuneConfig's twin in shape only: continued pre-training counts steps over a
# token stream cut into seq_len sequences, a fine-tune counts epochs over whole solutions; each is
# its own config section (leak, finetune) with its own defaults, so they are kept apart.
@dataclass
class MixConfig:
    dose: int = 4  # copies of each member in the stream; 0: none (the dose sweep's control)
    steps: int = 300
    batch_size: int = 8
    seq_len: int = 384
    lr: float = 5e-4
    warmup_ratio: float = 0.05
    seed: int = 0
    corpus_max_bytes: int = 8_000_000
    threads: int = 1

    def __post_init__(self):
        for name in ("dose", "steps", "batch_size", "seq_len", "corpus_max_bytes", "threads"):
            value, least = getattr(self, name), 0 if name == "dose" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise BadInput(f"must be an integer >= {least}, got {value!r}", field=f"leak.{name}")
        if self.seq_len < 8:
            raise BadInput(f"must be at least 8 tokens, got {self.seq_len}", field="leak.seq_len")
        if not self.lr > 0:
            raise BadInput(f"must be > 0, got {self.lr!r}", field="leak.lr")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise BadInput(f"must be in [0, 1), got {self.warmup_ratio!r}", field="leak.warmup_ratio")

    @property
    def n_tokens(self) -> int:
        """The token budget: every step sees batch_size sequences of seq_len tokens, once."""
        return self.steps * self.batch_size * self.seq_len

    def record(self) -> dict:
        return asdict(self)


@dataclass
class Mixture:
    sequences: np.ndarray  # [n_sequences, seq_len] int32, in training order
    occurrences: list[list[tuple[int, int]]]  # per member: (sequence, offset) of each copy's first token
    member_lengths: list[int]  # tokens per member text (EOS not counted)
    dose: int
    n_tokens: int
    stats: dict = field(default_factory=dict)

    @property
    def member_tokens(self) -> int:
        return self.dose * sum(self.member_lengths)

    @property
    def member_token_share(self) -> float:
        return self.member_tokens / self.n_tokens

    def summary(self) -> dict:
        counts = [len(o) for o in self.occurrences]
        return {
            "dose": self.dose, "n_members": len(self.occurrences), "n_tokens": self.n_tokens,
            "n_sequences": int(len(self.sequences)), "seq_len": int(self.sequences.shape[1]),
            "member_tokens": self.member_tokens, "member_token_share": round(self.member_token_share, 6),
            "occurrences_min": min(counts, default=0), "occurrences_max": max(counts, default=0),
            "member_tokens_mean": round(float(np.mean(self.member_lengths)), 1) if self.member_lengths else 0.0,
            **self.stats,
        }


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_mixture(tokenizer, corpus_texts: list[str], member_texts: list[str], dose: int, n_tokens: int,
                  seq_len: int, seed: int) -> Mixture:
    """A stream of exactly n_tokens: clean documents (seeded order, cycled if short) and each member
    `dose` times whole; refused when the budget cannot hold every copy. Dose 0 is the control: the
    same budget of clean documents alone."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise BadInput("the tokenizer has no EOS token to separate documents", field="eos_token_id")
    if dose < 0:
        raise BadInput(f"must be a non-negative integer, got {dose!r}", field="leak.dose")
    if n_tokens <= 0 or n_tokens % seq_len:
        raise BadInput(f"n_tokens {n_tokens} must be a positive multiple of seq_len {seq_len}", field="n_tokens")
    members = [_ids(tokenizer, t) + [eos] for t in member_texts]
    if any(len(m) == 1 for m in members):
        raise BadInput("a member text is empty", row=next(i for i, m in enumerate(members) if len(m) == 1),
                       field="member_texts")
    need = dose * sum(len(m) for m in members)
    if need > n_tokens:
        raise BadInput(f"{len(members)} members x dose {dose} need {need} tokens (EOS included) but the "
                       f"budget n_tokens = steps x batch_size x seq_len is {n_tokens}", field="leak.dose")
    rng = random.Random(seed)

    # clean documents, tokenized lazily in a seeded order, until the clean share is covered
    clean_need = n_tokens - need
    docs: list[list[int]] = []
    have, passes = 0, 0
    while have < clean_need:
        if not corpus_texts:
            raise BadInput(f"the clean corpus is empty but {clean_need} clean tokens are needed", field="corpus_texts")
        order = list(range(len(corpus_texts)))
        rng.shuffle(order)
        passes += 1
        for i in order:
            ids = _ids(tokenizer, corpus_texts[i])
            if not ids:
                continue
            docs.append(ids + [eos])
            have += len(docs[-1])
            if have >= clean_need:
                break
        else:
            if have == 0:
                raise BadInput("no clean corpus text has any token", field="corpus_texts")
    clean = np.fromiter((t for d in docs for t in d), dtype=np.int64, count=have)[:clean_need]
    bounds = np.cumsum([0] + [len(d) for d in docs])
    n_docs = int(np.searchsorted(bounds, clean_need, side="left"))  # documents (last one cut) in the budget
    bounds = np.minimum(bounds[: n_docs + 1], clean_need)

    # each copy at a boundary drawn uniformly among the n_docs + 1 (before doc j; j = n_docs: the end)
    copies = [(rng.randint(0, n_docs), rng.random(), m) for m in range(len(members)) for _ in range(dose)]
    copies.sort()
    out = np.empty(n_tokens, dtype=np.int64)
    occurrences: list[list[tuple[int, int]]] = [[] for _ in members]
    pos = cp = 0  # write position; clean tokens consumed
    straddle_long = straddle_end = filled = 0

    def put_clean(upto: int) -> None:
        nonlocal pos, cp
        if upto > cp:
            out[pos: pos + upto - cp] = clean[cp:upto]
            pos += upto - cp
            cp = upto

    k = 0
    for j in range(n_docs + 1):
        put_clean(int(bounds[j]))  # the rest of doc j-1 not already used as filler
        while k < len(copies) and copies[k][0] == j:
            m = members[copies[k][2]]
            room = seq_len - pos % seq_len
            if len(m) > room and len(m) <= seq_len and pos % seq_len:
                fill = min(room, clean_need - cp)
                filled += fill
                put_clean(cp + fill)
            start = pos
            out[pos: pos + len(m)] = m
            pos += len(m)
            if start // seq_len != (pos - 2) // seq_len:  # text tokens (EOS aside) in two sequences
                if len(m) - 1 > seq_len:
                    straddle_long += 1
                else:
                    straddle_end += 1
            occurrences[copies[k][2]].append((start // seq_len, start % seq_len))
            k += 1
    put_clean(clean_need)
    assert pos == n_tokens and cp == clean_need and k == len(copies)
    stats = {"clean_documents": n_docs, "corpus_passes": passes, "filler_tokens": filled,
             "copies_straddling_long": straddle_long, "copies_straddling_other": straddle_end}
    return Mixture(out.astype(np.int32).reshape(-1, seq_len), occurrences, [len(m) - 1 for m in members],
                   dose, n_tokens, stats)
