"""The self-calibrated route's one model pass: every task's reference and its rewrites scored
under the model under audit and under a reference model that is not the target's own checkpoint.

Runs in the driver through the same samplers as the collection (hf, vllm, or an OpenAI-compatible
endpoint that echoes log-probabilities); each model is loaded once and scores every text of the
benchmark. A row whose texts the backend could not score keeps NaN and its reason: it is left out
of the estimate, and the report counts it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from leakray.models.backends import make_sampler
from leakray.models.sampler import SampleConfig
from leakray.parts import PartClock, per_second
from leakray.perturb.rewrite import solution_rewrites
from leakray.schema import R, T, rewrite_scores_schema

LOG = logging.getLogger(__name__)
FILE = "rewrite_scores.parquet"


def _loglik(scores) -> float:
    return math.fsum(scores.logprobs) if scores.logprobs else math.nan


def reference_scores(model_path: str, sample: SampleConfig, pairs: list[tuple[str, str]], chunk: int = 64,
                     clock: PartClock | None = None, role: str = "model") -> list:
    """The backend's `RefScores` of each (prompt, full program) pair, the model loaded once;
    ``clock`` (`leakray.parts`) gets ``load_<role>`` and ``score_<role>``."""
    clock = clock or PartClock()
    with clock.part(f"load_{role}"):
        sampler = make_sampler(model_path, sample)
    out: list = []
    try:
        with clock.part(f"score_{role}"):
            for i in range(0, len(pairs), chunk):
                part = pairs[i:i + chunk]
                out += sampler.reference_scores([p for p, _ in part], [r for _, r in part])
                clock.count(f"score_{role}", len(part))
    finally:
        close = getattr(sampler, "close", None)
        if close is not None:
            close()
    return out


def score_texts(model_path: str, sample: SampleConfig, pairs: list[tuple[str, str]], chunk: int = 64,
                clock: PartClock | None = None, role: str = "model") -> list[float]:
    """log p(continuation | prompt) of each (prompt, full program) pair, NaN where unscorable."""
    return [_loglik(s) for s in reference_scores(model_path, sample, pairs, chunk, clock, role)]


def scoring_parts(clocked: dict) -> dict:
    """A scoring stage's marker entries (`leakray.parts`) from `parts.timed`'s clock: each model's
    load and score seconds (and the rewrites' making), and the texts each model scored per second
    of its score part."""
    seconds, counts = clocked["seconds"], clocked["counts"]
    return {"part_seconds": {part: round(s, 2) for part, s in seconds.items()}, "throughput": {
        f"{role}_texts_per_s": per_second(counts.get(f"score_{role}", 0), seconds.get(f"score_{role}"))
        for role in ("target", "reference")}}


def rewrite_scores(tasks: list[dict], target: str, target_sample: SampleConfig, reference: str,
                   n_rewrites: int = 16, seed: int = 0, clock: PartClock | None = None) -> pa.Table:
    """One row per task (schema R): the original and each rewrite under both models. ``clock``
    gets ``rewrite`` (making and proving the rewrites) and each model's load and score."""
    clock = clock or PartClock()
    plans = []
    with clock.part("rewrite"):
        for t in tasks:
            got = (solution_rewrites(t[T.PROMPT], t[T.REFERENCE], t[T.TESTS], n_rewrites, seed, t[T.TASK_ID])
                   if t[T.LANGUAGE] == "python" else f"rewrites are made for Python only, not {t[T.LANGUAGE]}")
            plans.append(got)
    pairs, spans = [], []
    for t, got in zip(tasks, plans):
        start = len(pairs)
        if not isinstance(got, str):
            pairs += [(t[T.PROMPT], t[T.REFERENCE])] + [(t[T.PROMPT], r) for r in got]
        spans.append((start, len(pairs)))
    LOG.info("scoring %d texts under the target and the reference model", len(pairs))
    tgt = score_texts(target, target_sample, pairs, clock=clock, role="target")
    ref_cfg = SampleConfig(**{**target_sample.__dict__, "backend": "hf", "lora_adapter": None})
    ref = score_texts(reference, ref_cfg, pairs, clock=clock, role="reference")
    rows = []
    for t, got, (a, b) in zip(tasks, plans, spans):
        if isinstance(got, str):
            rows.append({R.TASK_ID: t[T.TASK_ID], R.N_REWRITES: 0, R.REASON: got, R.TARGET_ORIGINAL: math.nan,
                         R.TARGET_REWRITES: [], R.REFERENCE_ORIGINAL: math.nan, R.REFERENCE_REWRITES: []})
            continue
        unscorable = any(math.isnan(v) for v in tgt[a:b] + ref[a:b])
        rows.append({R.TASK_ID: t[T.TASK_ID], R.N_REWRITES: b - a - 1,
                     R.REASON: "a text could not be scored (too long, or the backend gave no log-probabilities)"
                     if unscorable else "",
                     R.TARGET_ORIGINAL: tgt[a], R.TARGET_REWRITES: tgt[a + 1:b],
                     R.REFERENCE_ORIGINAL: ref[a], R.REFERENCE_REWRITES: ref[a + 1:b]})
    return pa.Table.from_pylist(rows, schema=rewrite_scores_schema())


def write_rewrite_scores(table: pa.Table, out: Path) -> Path:
    path = Path(out) / FILE
    pq.write_table(table, path)
    return path
