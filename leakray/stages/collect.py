"""The collection's stages: sample -> execute -> score -> embed, on pyarrow batches.

Each stage is a plain class or function on a batch (one row per task); `collect_steps` hands
them to an executor (`leakray.executor.batches`), which runs them in-process or as Ray Data
operators with actor pools where the state is heavy (a model, a sandbox pool, an encoder).
Actor-pool tasks retry at least once, so rows are keyed by task id and `finalize`
deduplicates them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from leakray.data.tasks import program_of
from leakray.models.sampler import SampleConfig
from leakray.schema import C, T, X, collection_schema
from leakray.stages.base import BatchStep, StageResources, chain

LOG = logging.getLogger(__name__)
FAULT_BARRIER_ENV = "LEAKRAY_FAULT_BARRIER"  # tests only: see fault_barrier
FAULT_BARRIER_TIMEOUT_S = 600.0


def fault_barrier(stage: str) -> None:
    """A test hook (tests/test_faults.py), a no-op unless $LEAKRAY_FAULT_BARRIER names a
    directory: then each call of a stage writes ``ready-<stage>-<pid>`` there and waits until
    ``release-<stage>`` exists (at most FAULT_BARRIER_TIMEOUT_S), so a fault test can kill the
    stage's actor while it holds a batch, at a known point, and then let the run go on."""
    where = os.environ.get(FAULT_BARRIER_ENV)
    if not where:
        return
    barrier = Path(where)
    release = barrier / f"release-{stage}"
    if release.exists():
        return
    (barrier / f"ready-{stage}-{os.getpid()}").touch()
    end = time.monotonic() + FAULT_BARRIER_TIMEOUT_S
    while not release.exists():
        if time.monotonic() > end:
            LOG.warning("fault barrier: no %s after %.0f s; going on", release, FAULT_BARRIER_TIMEOUT_S)
            return
        time.sleep(0.1)


def write_usage(sampler, directory: str, filesystem, name: str) -> None:
    """The worker's endpoint totals so far (`usage_totals`) as ``directory/name``, whole or not at
    all (a local file is written aside and renamed; an object store writes an object whole)."""
    from leakray.models.endpoint_sampler import usage_totals
    from leakray.runs import write_json_atomic

    totals = usage_totals(sampler)
    if totals is None:
        return
    if filesystem is None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(directory) / name, totals)
        return
    filesystem.create_dir(directory, recursive=True)
    with filesystem.open_output_stream(f"{directory}/{name}") as fh:
        fh.write(json.dumps(totals).encode())


# Where a collection's time goes, per row: model loads (attributed to the first batch a worker
# takes), the k samples, the reference's scores (under the model and the reference models), the
# extra passes (upper case, AdvPrompt variants, probes), the sandbox, CodeBLEU and the expert
# features, the encoder. Summed over rows: each part's busy time, wherever and however in
# parallel it ran (`collection_stats` turns them into seconds and throughputs).
PARTS = ("load", "sample", "reference", "extra_passes", "execute", "score", "embed")


def _add_part_seconds(batch: pa.Table, seconds: dict[str, list[float]]) -> pa.Table:
    """Add per-row seconds to the batch's part_seconds column (created at the first step)."""
    n = batch.num_rows
    rows = _col(batch, C.PART_SECONDS) if C.PART_SECONDS in batch.column_names else [None] * n
    rows = [list(r) if r else [0.0] * len(PARTS) for r in rows]
    for part, values in seconds.items():
        j = PARTS.index(part)
        for r, v in zip(rows, values):
            r[j] += v
    return _with(batch, {C.PART_SECONDS: rows})


def _timed_batch(part: str, load: float, t0: float, batch: pa.Table) -> pa.Table:
    """A whole-batch step's time (and a pending model load), split evenly over its rows."""
    n = max(1, batch.num_rows)
    spent = {part: [(time.perf_counter() - t0) / n] * batch.num_rows}
    if load:
        spent["load"] = [load / n] * batch.num_rows
    return _add_part_seconds(batch, spent)


@dataclass
class CollectConfig:
    sample: SampleConfig = field(default_factory=SampleConfig)
    execute_timeout_s: float = 10.0
    execute_threads: int = 4
    allow_weak_isolation: bool = False
    embed_model: str = "minilm"
    embed_max_tokens: int = 510
    embed_stride: int = 256
    embed_batch_size: int = 16
    # the sandbox's processes are outside Ray's accounting; its actors only wait on them
    sample_resources: StageResources = field(default_factory=lambda: StageResources(2, 1.0))
    execute_resources: StageResources = field(default_factory=lambda: StageResources(1, 0.0))
    embed_resources: StageResources = field(default_factory=lambda: StageResources(1, 0.0))
    embed_with_sampler: bool = True  # the encoder in the sampler's workers, no pool of its own
    batch_size: int = 8  # tasks per batch through every stage
    extra: "ExtraColumns" = field(default_factory=lambda: ExtraColumns())


def _col(batch: pa.Table, name: str) -> list:
    return batch.column(name).to_pylist()


def _with(batch: pa.Table, columns: dict[str, list]) -> pa.Table:
    schema = collection_schema()
    for name, values in columns.items():
        arr = pa.array(values, type=schema.field(name).type)
        idx = batch.schema.get_field_index(name)
        batch = batch.set_column(idx, name, arr) if idx >= 0 else batch.append_column(name, arr)
    return batch


@dataclass
class ExtraColumns:
    """Optional collection columns and what they cost: each is one more pass of the model."""

    reference_model: str | None = None  # path: score the reference under it too (calibrated attacks)
    alt_reference_model: str | None = None  # path: and under a second, non-oracle reference model
    upper_case: bool = False  # k completions of the upper-cased prompt (BUZZER-b)
    advprompt: bool = False  # one greedy completion per AdvPrompt variant (input column adv_prompts)
    # text-only memory probes (leakray.features.probes.PROBES): one batched greedy call each per batch of tasks
    probes: tuple[str, ...] = ()
    probe_tokens: int = 48  # generation budget of a probe continuation (it is compared over 32 code tokens)
    next_cuts: int = 64  # the next-token probe's cut points per task (at most)
    next_draws: int = 128  # one-token samples per cut


class SampleStage:
    """k completions per prompt with perplexities, the reference's per-token scores under the
    model (and a reference model), and the optional extra passes of `ExtraColumns`."""

    usage_to: tuple[str, object] | None = None  # see __init__

    def __init__(self, model_path: str, sample: SampleConfig, extra: ExtraColumns | None = None,
                 usage_to: tuple[str, object] | None = None):
        """``usage_to``: (directory, pyarrow filesystem or None for a local one) where this worker
        keeps what its endpoint sampler was asked for, one file per worker rewritten after each
        batch (`write_usage`); the stage adds them up (`protocols.collection.endpoint_usage`)."""
        from dataclasses import replace

        from leakray.models.backends import make_sampler

        t0 = time.perf_counter()
        self.sampler = make_sampler(model_path, sample)
        self.extra = extra or ExtraColumns()
        self.ref_sampler = None
        if self.extra.reference_model:
            self.ref_sampler = make_sampler(self.extra.reference_model, replace(sample, backend="hf"))
        self.alt_sampler = None
        if self.extra.alt_reference_model:
            self.alt_sampler = make_sampler(self.extra.alt_reference_model, replace(sample, backend="hf"))
        self._load_s = time.perf_counter() - t0  # reported with the first batch this worker takes
        self.usage_to, self._usage_name = usage_to, f"{os.getpid()}-{time.time_ns()}.json"
        self.kind_seconds: Counter = Counter()  # batched generation seconds by kind (sample, upper, adv, probes)

    def __call__(self, batch: pa.Table) -> pa.Table:
        fault_barrier("SampleStage")
        prompts, refs = _col(batch, C.PROMPT), _col(batch, C.REFERENCE)
        langs, keys = _col(batch, C.LANGUAGE), _col(batch, C.TASK_ID)
        adv = _col(batch, C.ADV_PROMPTS) if self.extra.advprompt and C.ADV_PROMPTS in batch.column_names else None
        tests = _col(batch, T.TESTS) if T.TESTS in batch.column_names else [""] * len(prompts)
        rows, spent = [], {p: [] for p in ("sample", "reference", "extra_passes")}
        pre = self._prefetch(prompts, refs, langs, keys, adv, tests)
        for i in range(len(prompts)):
            self._spent = dict.fromkeys(spent, 0.0)
            self._pre = pre[i] if pre else None
            try:
                rows.append(self._row(prompts[i], refs[i], langs[i], keys[i], adv[i] if adv else None, tests[i]))
            except Exception as exc:  # one task's crash (a prompt that breaks the tokenizer) fails that row alone
                if isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__:
                    raise  # the worker's state, not the row: Ray retries the batch
                LOG.warning("sampling %s failed: %s", keys[i], type(exc).__name__, exc_info=True)
                k = self.sampler.cfg.k
                rows.append({C.COMPLETIONS: [""] * k, C.PERPLEXITY: [float("nan")] * k, C.N_TOKENS: [0] * k,
                             C.REF_LOSS: float("nan"), C.NOTES: [failure_note(exc)]})
            for part, s in self._spent.items():
                spent[part].append(s)
        load, self._load_s = getattr(self, "_load_s", 0.0), 0.0
        if load and rows:
            spent["load"] = [load / len(rows)] * len(rows)
        # every batch gets the same columns (a failed row's are null), even one whose rows all failed
        out = _with(batch, {name: [row.get(name) for row in rows] for name in self._columns(adv is not None)})
        if self.usage_to is not None:
            write_usage(self.sampler, *self.usage_to, self._usage_name)
        return _add_part_seconds(out, spent)

    def _prefetch(self, prompts, refs, langs, keys, adv, tests) -> list[dict] | None:
        """Every generation of the batch's rows, one sampler call per kind across all tasks (a
        backend that batches tasks, `batches_tasks`, then keeps its compute units full and drops
        each sequence when it ends), each call's time shared evenly by the rows. None when the
        backend works task by task, or a call failed: then each row generates on its own, so a
        prompt that breaks the tokenizer fails its row alone."""
        if not getattr(self.sampler, "batches_tasks", False) or not prompts:
            return None
        from leakray.features import probes as pr

        n, sampler, pre = len(prompts), self.sampler, [{"seconds": {}} for _ in prompts]

        def timed(part: str, fn):
            t0 = time.perf_counter()
            got = fn()
            spent = time.perf_counter() - t0
            self.kind_seconds[part] += spent
            for p in pre:
                p["seconds"][part] = p["seconds"].get(part, 0.0) + spent / n
            return got

        def continuations(cuts_of: list[list[int]], part: str) -> list[list[str]]:
            given = [[pr.given_and_target(prompts[i], refs[i], c)[0] for c in cuts] for i, cuts in enumerate(cuts_of)]
            flat = [(i, g) for i, gs in enumerate(given) for g in gs]
            got = timed(part, lambda: sampler.greedy_probe([g for _, g in flat], [langs[i] for i, _ in flat],
                                                           [keys[i] for i, _ in flat], self.extra.probe_tokens)
                        if flat else [])
            out: list[list[str]] = [[] for _ in prompts]
            for (i, _), text in zip(flat, got):
                out[i].append(text)
            return out

        try:
            for p, s in zip(pre, timed("sample", lambda: sampler.sample(prompts, langs, keys))):
                p["sample"] = s
            if self.extra.upper_case:
                from leakray.perturb.case import uppercase_prompt

                upper = timed("upper", lambda: sampler.sample([uppercase_prompt(q, lang) for q, lang in zip(prompts, langs)],
                                                              langs, [key + "#upper" for key in keys]))
                for p, u in zip(pre, upper):
                    p["upper"] = u
            if adv is not None:
                flat = [(i, j, q) for i, row in enumerate(adv) for j, q in enumerate(row or []) if q]
                got = timed("adv", lambda: sampler.sample([q for _, _, q in flat], [langs[i] for i, _, _ in flat],
                                                          [keys[i] for i, _, _ in flat], k=1, greedy=True)
                            if flat else [])
                for i, row in enumerate(adv):
                    pre[i]["adv"] = ([""] * len(row or []), [float("nan")] * len(row or []))
                for (i, j, _), s in zip(flat, got):
                    pre[i]["adv"][0][j], pre[i]["adv"][1][j] = s.completions[0], s.perplexity[0]
            if "prefix" in self.extra.probes:
                cuts = [pr.prefix_cuts(q, r) for q, r in zip(prompts, refs)]
                for p, c, texts in zip(pre, cuts, continuations(cuts, "prefix")):
                    p["prefix"] = (c, texts)
            if "mask" in self.extra.probes:
                spans = [pr.mask_spans(q, r) for q, r in zip(prompts, refs)]
                for p, sp, texts in zip(pre, spans, continuations([[at for at, _ in s] for s in spans], "mask")):
                    p["mask"] = ([span for _, span in sp], texts)
            if "greedy" in self.extra.probes:
                got = timed("greedy", lambda: self._greedy(prompts, langs, keys, adv, pre))
                for i, (p, text) in enumerate(zip(pre, got)):
                    p["greedy"] = (text, pr.rewrite_continuations(prompts[i], refs[i], tests[i], keys[i]))
            for name in (n for n in pr.DRAW_PROBES if n in self.extra.probes
                         and getattr(sampler, "draws_tokens", True)):
                cut_at, given_at = pr.DRAW_PROBES[name]
                cuts = [cut_at(q, r, self.extra.next_cuts) for q, r in zip(prompts, refs)]
                flat = [(i, given_at(prompts[i], refs[i], c)[0]) for i, cs in enumerate(cuts) for c in cs]
                got = timed(name, lambda: sampler.next_token_draws(
                    [g for _, g in flat], [draw_key(keys[i], name) for i, _ in flat], self.extra.next_draws))
                draws: list[list[list[str]]] = [[] for _ in prompts]
                for (i, _), d in zip(flat, got):
                    draws[i].append(d)
                for p, c, d in zip(pre, cuts, draws):
                    p[name] = (c, d)
        except Exception as exc:
            if isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__:
                raise
            LOG.warning("batched sampling failed (%s); sampling task by task", type(exc).__name__, exc_info=True)
            return None
        return pre

    def _clock(self, part: str, t0: float) -> float:
        """Add the time since ``t0`` to this row's ``part``; returns now (the next part's start)."""
        now = time.perf_counter()
        self._spent[part] += now - t0  # set per row by __call__, the only caller of _row
        return now

    def _columns(self, adv: bool) -> list[str]:
        names = [C.COMPLETIONS, C.PERPLEXITY, C.N_TOKENS, C.REF_LOSS, C.REF_TOKEN_LOGPROBS, C.REF_TOKEN_MU,
                 C.REF_TOKEN_SIGMA, C.REF_TOKEN_RANK, C.PROMPT_LOGPROB]
        names += [C.REFMODEL_TOKEN_LOGPROBS, C.REFMODEL_PROMPT_LOGPROB] if self.ref_sampler is not None else []
        names += [C.REFALT_TOKEN_LOGPROBS] if self.alt_sampler is not None else []
        names += [C.UPPER_COMPLETIONS, C.UPPER_PERPLEXITY] if self.extra.upper_case else []
        names += [C.ADV_COMPLETIONS, C.ADV_PERPLEXITY] if adv else []
        names += [c for name in self.extra.probes for c in PROBE_COLUMNS[name]]
        names += [col for name in self.extra.probes if name in REFERENCE_DRAW_COLUMNS
                  for col, _ in self._reference_draws(name)]
        names += [C.PROBE_SECONDS] if self.extra.probes else []
        return names + [C.NOTES]

    def _row(self, prompt: str, ref: str, lang: str, key: str, adv_prompts: list[str] | None,
             tests: str = "") -> dict:
        # one task at a time: the sampler's counters (truncations, NaN losses) become this row's notes
        k, sampler, pre = self.sampler.cfg.k, self.sampler, self._pre
        before = Counter(sampler.stats)
        t = time.perf_counter()
        if pre is not None:  # generated with the batch's other tasks (`_prefetch`): its time is its share
            s = pre["sample"]  # the batch's counters moved in `_prefetch`: the row's own are in s.notes
            self._spent["sample"] += pre["seconds"]["sample"]
            self._spent["extra_passes"] += sum(v for part, v in pre["seconds"].items() if part != "sample")
        else:
            (s,) = sampler.sample([prompt], [lang], [key])
        t = self._clock("sample", t)
        (scores,) = sampler.reference_scores([prompt], [ref])
        # the sampler's counters repeat some of the scores' own notes: each reason once per row
        notes = list(dict.fromkeys(list(s.notes) + list(scores.notes)
                                   + sorted((Counter(sampler.stats) - before).elements())))
        if math.isnan(scores.loss) and not any(n.startswith("ref_loss") for n in notes):
            notes.append("ref_loss_unscorable")
        if row_failed(notes) or len(s.completions) != k:  # placeholders; the row leaves at finalize
            s.completions, s.perplexity, s.n_tokens = [""] * k, [float("nan")] * k, [0] * k
            notes += [] if row_failed(notes) else ["failed:sampler_returned_wrong_k"]
        row = {C.COMPLETIONS: s.completions, C.PERPLEXITY: s.perplexity, C.N_TOKENS: s.n_tokens,
               C.REF_LOSS: scores.loss, C.REF_TOKEN_LOGPROBS: scores.logprobs, C.REF_TOKEN_MU: scores.mu,
               C.REF_TOKEN_SIGMA: scores.sigma, C.REF_TOKEN_RANK: scores.rank, C.PROMPT_LOGPROB: _or_none(scores.context_logprob)}
        if self.ref_sampler is not None:
            (base,) = self.ref_sampler.reference_scores([prompt], [ref])
            row[C.REFMODEL_TOKEN_LOGPROBS] = base.logprobs
            row[C.REFMODEL_PROMPT_LOGPROB] = _or_none(base.context_logprob)
            notes += [f"refmodel_{n}" for n in base.notes]
        if self.alt_sampler is not None:
            (alt,) = self.alt_sampler.reference_scores([prompt], [ref])
            row[C.REFALT_TOKEN_LOGPROBS] = alt.logprobs
            notes += [f"refalt_{n}" for n in alt.notes]
        t = self._clock("reference", t)
        if self.extra.upper_case and not row_failed(notes):
            from leakray.perturb.case import uppercase_prompt

            (u,) = [pre["upper"]] if pre is not None else \
                sampler.sample([uppercase_prompt(prompt, lang)], [lang], [key + "#upper"])
            row[C.UPPER_COMPLETIONS], row[C.UPPER_PERPLEXITY] = u.completions, u.perplexity
        if adv_prompts is not None and not row_failed(notes):
            row[C.ADV_COMPLETIONS], row[C.ADV_PERPLEXITY] = pre["adv"] if pre is not None else \
                self._adv(adv_prompts, lang, key)
        if self.extra.probes and not row_failed(notes):
            row.update(self._probes(prompt, ref, lang, key, tests))
        self._clock("extra_passes", t)
        row[C.NOTES] = notes
        return row

    def _probes(self, prompt: str, ref: str, lang: str, key: str, tests: str) -> dict:
        """The memory probes switched on, each one batched greedy call over the task's texts
        (its cut points, or its masks), timed on its own."""
        from leakray.features import probes as pr

        out: dict = {}
        seconds = [0.0] * len(pr.PROBES)
        pre = self._pre
        if pre is not None:  # generated with the batch's other tasks
            for name in (n for n in self.extra.probes if n in pre):  # a probe the backend cannot ask is absent
                cols = PROBE_COLUMNS[name]
                out[cols[0]], out[cols[1]] = pre[name]
                seconds[pr.PROBES.index(name)] = pre["seconds"][name]
            out[C.PROBE_SECONDS] = seconds
            return self._with_reference_draws(out, prompt, ref, key)
        for name in self.extra.probes:
            t0 = time.perf_counter()
            if name == "prefix":
                cuts = pr.prefix_cuts(prompt, ref)
                out[C.PREFIX_CUTS], out[C.PREFIX_COMPLETIONS] = cuts, self._continue(prompt, ref, cuts, lang, key)
            elif name == "mask":
                spans = pr.mask_spans(prompt, ref)
                out[C.MASK_SPANS] = [span for _, span in spans]
                out[C.MASK_COMPLETIONS] = self._continue(prompt, ref, [at for at, _ in spans], lang, key)
            elif name in pr.DRAW_PROBES:
                if not getattr(self.sampler, "draws_tokens", True):
                    continue  # a chat model's first token opens an answer: the columns stay empty
                cut_at, given_at = pr.DRAW_PROBES[name]
                cuts = cut_at(prompt, ref, self.extra.next_cuts)
                given = [given_at(prompt, ref, c)[0] for c in cuts]
                cuts_col, draws_col = PROBE_COLUMNS[name]
                out[cuts_col] = cuts
                out[draws_col] = self.sampler.next_token_draws(given, [draw_key(key, name)] * len(given),
                                                               self.extra.next_draws)
            else:  # greedy: the prompt alone; its rewrites are made here (no model), the null it is compared with
                (out[C.GREEDY_COMPLETION],) = self.sampler.greedy_probe([prompt], [lang], [key],
                                                                        self.sampler.cfg.max_new_tokens)
                out[C.REWRITES] = pr.rewrite_continuations(prompt, ref, tests, key)
            seconds[pr.PROBES.index(name)] = time.perf_counter() - t0
        out[C.PROBE_SECONDS] = seconds
        return self._with_reference_draws(out, prompt, ref, key)

    def _reference_draws(self, probe: str) -> list[tuple[str, object]]:
        """(column, sampler) of the local reference models that draw at a sampled probe's cuts too."""
        return [(col, s) for col, s in zip(REFERENCE_DRAW_COLUMNS[probe], (self.ref_sampler, self.alt_sampler))
                if s is not None]

    def _with_reference_draws(self, out: dict, prompt: str, ref: str, key: str) -> dict:
        """The reference models' draws at the target's cuts of each sampled probe (what
        calibrates it for how predictable the text is); their time counts as the probe's."""
        from leakray.features.probes import DRAW_PROBES, PROBES

        for name, (_, given_at) in DRAW_PROBES.items():
            cuts_col = PROBE_COLUMNS[name][0]
            if cuts_col not in out:
                continue
            t0 = time.perf_counter()
            given = [given_at(prompt, ref, c)[0] for c in out[cuts_col]]
            for col, sampler in self._reference_draws(name):
                out[col] = sampler.next_token_draws(given, [draw_key(key, name)] * len(given), self.extra.next_draws)
            out[C.PROBE_SECONDS][PROBES.index(name)] += time.perf_counter() - t0
        return out

    def _continue(self, prompt: str, ref: str, cuts: list[int], lang: str, key: str) -> list[str]:
        from leakray.features.probes import given_and_target

        given = [given_and_target(prompt, ref, cut)[0] for cut in cuts]
        return self.sampler.greedy_probe(given, [lang] * len(given), [key] * len(given),
                                         self.extra.probe_tokens) if given else []

    def _greedy(self, prompts: list[str], langs: list[str], keys: list[str], adv: list | None,
                pre: list[dict]) -> list[str]:
        """The greedy probe's continuation of each prompt. Where AdvPrompt's pass ran, its base
        slot is this very request (the unperturbed prompt, greedy, the sampler's token budget and
        stop strings, the same key), so that completion is taken rather than decoded twice; only
        the batch of tasks it was decoded with differs (on a near-tie in the last bits, as any
        batching may). Called from `_prefetch` only: a local backend, whose failures raise."""
        got: list[str | None] = [pre[i]["adv"][0][0] if adv is not None and adv[i] and adv[i][0] == prompts[i]
                                 else None for i in range(len(prompts))]
        todo = [i for i, text in enumerate(got) if text is None]
        if todo:
            texts = self.sampler.greedy_probe([prompts[i] for i in todo], [langs[i] for i in todo],
                                              [keys[i] for i in todo], self.sampler.cfg.max_new_tokens)
            for i, text in zip(todo, texts):
                got[i] = text
        return got

    def _adv(self, adv_prompts: list[str], lang: str, key: str) -> tuple[list[str], list[float]]:
        """One greedy completion per present variant, all of a task's variants in one call (the
        backend batches them and reuses the shared prefix); missing slots stay "" / NaN."""
        present = [j for j, p in enumerate(adv_prompts) if p]
        got = self.sampler.sample([adv_prompts[j] for j in present], [lang] * len(present), [key] * len(present),
                                  k=1, greedy=True)
        comps, ppls = [""] * len(adv_prompts), [float("nan")] * len(adv_prompts)
        for j, s in zip(present, got):
            comps[j], ppls[j] = s.completions[0], s.perplexity[0]
        return comps, ppls


PROBE_COLUMNS = {"prefix": (C.PREFIX_CUTS, C.PREFIX_COMPLETIONS), "mask": (C.MASK_SPANS, C.MASK_COMPLETIONS),
                 "greedy": (C.GREEDY_COMPLETION, C.REWRITES), "next": (C.NEXT_CUTS, C.NEXT_DRAWS),
                 "question": (C.QUESTION_CUTS, C.QUESTION_DRAWS)}
# the sampled probes' draws under the reference model and the non-oracle reference, at the same cuts
REFERENCE_DRAW_COLUMNS = {"next": (C.REFMODEL_NEXT_DRAWS, C.REFALT_NEXT_DRAWS),
                          "question": (C.REFMODEL_QUESTION_DRAWS, C.REFALT_QUESTION_DRAWS)}
# what the non-oracle reference model fills: its token log-probabilities and its probes' draws
ALT_REFERENCE_COLUMNS = (C.REFALT_TOKEN_LOGPROBS, *(alt for _, alt in REFERENCE_DRAW_COLUMNS.values()))


def draw_key(key: str, probe: str) -> str:
    """The seed key of a sampled probe's draws: the task's own for ``next`` (its draws as before
    the question probe existed), the task's and the probe's for the others, so that two probes'
    draws at a shared prefix are not the same random numbers."""
    return key if probe == "next" else f"{key}#{probe}"


def row_failed(notes) -> bool:
    """A row whose sampling failed for good (e.g. `endpoint_failed:http_500`): it is carried
    through the stages untouched and written to the errors file, never into the collection."""
    return any("failed:" in n for n in notes or [])


def failure_note(exc: Exception) -> str:
    """The note on a row whose sampling raised: the exception's type, never its message (it may
    quote the prompt), and for a probe the endpoint's reason (`ProbeFailed.reason`: http_429,
    timeout, ...), which says whether trying the row again can help."""
    from leakray.models.endpoint_sampler import ProbeFailed

    reason = exc.reason if isinstance(exc, ProbeFailed) else None
    return f"failed:sample_error:{type(exc).__name__}" + (f":{reason}" if reason else "")


# Failures another attempt can cure (the endpoint sampler's own retries are spent, the cause may
# not be): a rate limit, a timeout, a dropped connection, a server error or a garbled answer, for a
# row's sampling or for one of its probes; a sandbox harness that broke. Not a refusal (another 4xx:
# the same request is refused again) nor a crash on the row's own input: the same row fails the same way.
_TRANSIENT = re.compile(r"(?:endpoint_failed:|sample_error:ProbeFailed:)"
                        r"(?:http_(?:408|409|429|5\d\d)|timeout|connection|malformed_json)$|failed:sandbox_harness:")


def row_retryable(notes) -> bool:
    """A failed row whose every failure note is one another attempt can cure (`_TRANSIENT`)."""
    failures = [n for n in notes or [] if "failed:" in n]
    return bool(failures) and all(_TRANSIENT.search(n) for n in failures)


class ExecuteStage:
    """Runs every completion (as `program_of` the prompt) against the task's tests in the sandbox."""

    def __init__(self, timeout_s: float = 10.0, threads: int = 4, allow_weak_isolation: bool = False):
        from leakray.sandbox import Sandbox, SandboxConfig

        t0 = time.perf_counter()
        self.sandbox = Sandbox(SandboxConfig(timeout_s=timeout_s, allow_weak_isolation=allow_weak_isolation))
        self.threads = threads
        self._load_s = time.perf_counter() - t0

    def __call__(self, batch: pa.Table) -> pa.Table:
        fault_barrier("ExecuteStage")
        t0, (load, self._load_s) = time.perf_counter(), (getattr(self, "_load_s", 0.0), 0.0)
        return _timed_batch("execute", load, t0, self._execute(batch))

    def _execute(self, batch: pa.Table) -> pa.Table:
        rows = batch.select([C.TASK_ID, C.LANGUAGE, C.PROMPT, C.COMPLETIONS, T.TESTS, T.RUNNER]).to_pylist()
        for row, notes in zip(rows, _col(batch, C.NOTES) if C.NOTES in batch.column_names else [[]] * len(rows)):
            row[C.NOTES] = notes
        requests, spans = [], []
        for row in rows:
            start = len(requests)
            if row[T.TESTS].strip() and not row_failed(row[C.NOTES]):
                for j, completion in enumerate(row[C.COMPLETIONS]):
                    requests.append({
                        X.ID: f"{row[C.TASK_ID]}#{j}", X.LANGUAGE: row[C.LANGUAGE], X.RUNNER: row[T.RUNNER],
                        X.PROGRAM: program_of(row[C.PROMPT], completion), X.TESTS: row[T.TESTS],
                    })
            spans.append((start, len(requests)))
        results = self._run(requests)
        status, passed, notes = [], [], []
        for (a, b), row in zip(spans, rows):
            notes.append(list(row[C.NOTES] or []))
            if a == b:  # no tests: the pass feature is absent, not "failed" (or the row failed earlier)
                status.append(["not-run" if row_failed(row[C.NOTES]) else "no-tests"] * len(row[C.COMPLETIONS]))
                passed.append([False] * len(row[C.COMPLETIONS]))
                continue
            status.append([r[X.STATUS] for r in results[a:b]])
            passed.append([bool(r[X.PASSED]) and r[X.STATUS] == "passed" for r in results[a:b]])
            broken = next((r for r in results[a:b] if r.get(X.HARNESS_ERROR)), None)
            if broken is not None:  # not the program's verdict: the row goes to the errors file, not "not passed"
                LOG.warning("sandbox harness failed twice on %s: %s", broken[X.ID], broken[X.STDERR_TAIL][-500:])
                notes[-1].append(f"failed:sandbox_harness:{broken[X.HARNESS_ERROR]}")
        return _with(batch, {
            C.EXEC_STATUS: status, C.PASSED: passed,
            C.HAS_TESTS: [bool(row[T.TESTS].strip()) for row in rows], C.NOTES: notes,
        })

    def _run(self, requests: list[dict]) -> list[dict]:
        """Results in order; a result the sandbox failed to produce (`X.HARNESS_ERROR`) is tried once more."""
        from leakray.sandbox.core import error_result

        # a NUL byte never compiles: the model's own error, not a bad request that would fail the row
        results = [error_result(r[X.ID], "the program holds a NUL byte") if "\x00" in r[X.PROGRAM] else None
                   for r in requests]
        todo = [i for i, r in enumerate(results) if r is None]
        for _ in range(2):
            for i, r in zip(todo, self.sandbox.run_many([requests[i] for i in todo], workers=self.threads)):
                results[i] = r
            todo = [i for i in todo if results[i].get(X.HARNESS_ERROR)]
            if not todo:
                break
        return results


def solutions(batch: pa.Table) -> tuple[list[list[str]], list[str]]:
    """What is compared and embedded, both sides alike (`features.expert.comparable`)."""
    from leakray.features.expert import comparable

    prompts, langs = _col(batch, C.PROMPT), _col(batch, C.LANGUAGE)
    comps = [[comparable(p, c, lang) for c in row]
             for p, row, lang in zip(prompts, _col(batch, C.COMPLETIONS), langs)]
    refs = [comparable(p, r, lang, reference=True)
            for p, r, lang in zip(prompts, _col(batch, C.REFERENCE), langs)]
    return comps, refs


def score_stage(batch: pa.Table) -> pa.Table:
    t0 = time.perf_counter()
    return _timed_batch("score", 0.0, t0, _score(batch))


def _score(batch: pa.Table) -> pa.Table:
    from leakray.features.expert import score_batch

    completions, refs = solutions(batch)
    previous = _col(batch, C.NOTES) if C.NOTES in batch.column_names else [[] for _ in refs]
    ok = [i for i, prev in enumerate(previous) if not row_failed(prev)]  # failed rows are not scored
    notes = [Counter() for _ in refs]
    columns = {name: [[] for _ in refs] for name in (C.CODEBLEU, C.EDIT_DISTANCE, C.EXPERT)}
    if ok:
        pick = lambda values: [values[i] for i in ok]  # noqa: E731
        scored = score_batch({
            C.REFERENCE: pick(refs), C.LANGUAGE: pick(_col(batch, C.LANGUAGE)), C.COMPLETIONS: pick(completions),
            C.PERPLEXITY: pick(_col(batch, C.PERPLEXITY)), C.PASSED: pick(_col(batch, C.PASSED)),
            C.HAS_TESTS: pick(_col(batch, C.HAS_TESTS)),
        }, row_stats=pick(notes))
        for name in columns:
            for i, v in zip(ok, scored[name]):
                columns[name][i] = list(map(float, v))
    return _with(batch, {**columns,
                         C.NOTES: [list(prev or []) + sorted(n.elements()) for prev, n in zip(previous, notes)]})


class EmbedStage:
    """Sliding-window encoder embeddings of the k solutions (k*d, row-major) and the reference (d)."""

    def __init__(self, model: str, max_tokens: int, stride: int, batch_size: int, device: str = "cpu"):
        from leakray.features.embed import SlidingWindowEmbedder
        from leakray.models.encoders import resolve_encoder

        t0 = time.perf_counter()
        self.embedder = SlidingWindowEmbedder(resolve_encoder(model), device=device, max_tokens=max_tokens,
                                              stride=stride, batch_size=batch_size)
        self._load_s = time.perf_counter() - t0

    def __call__(self, batch: pa.Table) -> pa.Table:
        fault_barrier("EmbedStage")
        t0, (load, self._load_s) = time.perf_counter(), (getattr(self, "_load_s", 0.0), 0.0)
        return _timed_batch("embed", load, t0, self._embed(batch))

    def _embed(self, batch: pa.Table) -> pa.Table:
        completions, refs = solutions(batch)
        k = len(completions[0])
        n = len(refs)
        adv = adv_texts(batch) if C.ADV_COMPLETIONS in batch.column_names else None
        flat_adv = [t for row in adv if row is not None for t in row if t] if adv else []  # None: a failed row
        vectors = self.embedder.embed([c for row in completions for c in row] + refs + flat_adv)
        gen = vectors[: n * k].reshape(n, -1)
        out = {C.GEN_EMBEDDING: [list(map(float, g)) for g in gen],
               C.REF_EMBEDDING: [list(map(float, r)) for r in vectors[n * k: n * k + n]]}
        if adv:  # missing variants embed as zeros (their adv_kind is "")
            it, rows = iter(vectors[n * k + n:]), []
            for row in adv:
                if row is None:
                    rows.append(None)
                    continue
                rows.append([float(x) for t in row for x in (next(it) if t else np.zeros(vectors.shape[1]))])
            out[C.ADV_EMBEDDING] = rows
        return _with(batch, out)


def adv_texts(batch: pa.Table) -> list[list[str] | None]:
    """The comparable text of each AdvPrompt completion ("" for a missing slot)."""
    from leakray.features.expert import comparable

    out = []
    for prompts, comps, lang in zip(_col(batch, C.ADV_PROMPTS), _col(batch, C.ADV_COMPLETIONS),
                                    _col(batch, C.LANGUAGE)):
        out.append(None if comps is None else
                   [comparable(p, c, lang) if p else "" for p, c in zip(prompts, comps)])
    return out


def embed_device(cfg: CollectConfig) -> str:
    """The encoder runs where its actors were placed: on their GPU share when they have one (the
    sampler's, when it runs in the sampler's workers)."""
    placed = cfg.sample_resources if cfg.embed_with_sampler else cfg.embed_resources
    return "cuda" if placed.gpus else "cpu"


def collect_steps(model_path: str, cfg: CollectConfig, usage_to: tuple[str, object] | None = None
                  ) -> list[BatchStep]:
    """The collection as batch steps: sample -> execute -> score -> embed, or, with
    ``embed_with_sampler``, (sample + embed) -> execute -> score. ``usage_to``: where the
    samplers keep what they asked an endpoint for (`SampleStage`)."""
    sample = BatchStep(SampleStage, {"model_path": model_path, "sample": cfg.sample, "extra": cfg.extra,
                                     "usage_to": usage_to}, cfg.sample_resources)
    embed = BatchStep(EmbedStage, {"model": cfg.embed_model, "max_tokens": cfg.embed_max_tokens,
                                   "stride": cfg.embed_stride, "batch_size": cfg.embed_batch_size,
                                   "device": embed_device(cfg)}, cfg.embed_resources)
    rest = [
        BatchStep(ExecuteStage, {"timeout_s": cfg.execute_timeout_s, "threads": cfg.execute_threads,
                                 "allow_weak_isolation": cfg.allow_weak_isolation}, cfg.execute_resources),
        # light (CodeBLEU on a batch's completions): no CPU of its own to reserve; a function step runs as
        # Ray tasks, as many at once as Ray Data starts (`actors` bounds class steps' pools only)
        BatchStep(score_stage, resources=StageResources(actors=1, cpus=0.0)),
    ]
    if cfg.embed_with_sampler:
        # The encoder reads only the completions and references, so it can run right after the
        # sampler, in the sampler's own workers: an encoder pool of its own costs one more fresh
        # process per collection, and its start-up (importing torch and transformers, ~9 s of
        # CPU here) is most of a small collection's embedding time.
        return [chain(sample, embed), *rest]
    return [sample, *rest, embed]


def input_table(tasks: list[dict], folds: dict[str, int], members: set[str]) -> pa.Table:
    rows = [{
        C.TASK_ID: t[T.TASK_ID], C.BENCHMARK: t[T.BENCHMARK], C.LANGUAGE: t[T.LANGUAGE],
        C.FOLD: folds.get(t[T.TASK_ID], -1), C.MEMBER: int(t[T.TASK_ID] in members),
        C.PROMPT: t[T.PROMPT], C.REFERENCE: t[T.REFERENCE], T.TESTS: t[T.TESTS], T.RUNNER: t[T.RUNNER],
    } for t in tasks]
    schema = collection_schema()
    fields = [schema.field(n) for n in (C.TASK_ID, C.BENCHMARK, C.LANGUAGE, C.FOLD, C.MEMBER, C.PROMPT,
                                        C.REFERENCE)]
    return pa.Table.from_pylist(rows, schema=pa.schema(fields + [pa.field(T.TESTS, pa.string()),
                                                                 pa.field(T.RUNNER, pa.string())]))


class AllRowsFailed(RuntimeError):
    """Every row of a collection failed: a systemic fault (a broken model or sandbox), not bad rows."""


def _or_none(value: float) -> float | None:
    """NaN (the backend gave no value) as null: a detector that needs the column is then skipped."""
    return None if value is None or math.isnan(value) else value


def finalize(table: pa.Table, errors_path: Path | None = None) -> pa.Table:
    """One row per task (retries deduplicated), sorted, cast to the collection schema. Rows
    whose processing failed for good go to `errors_path` (task id and reasons), not the collection;
    `AllRowsFailed` when no row is left."""
    chosen: dict[str, int] = {}
    notes = table.column(C.NOTES).to_pylist() if C.NOTES in table.column_names else [[]] * table.num_rows
    for i, task_id in enumerate(table.column(C.TASK_ID).to_pylist()):
        if task_id not in chosen or (row_failed(notes[chosen[task_id]]) and not row_failed(notes[i])):
            chosen[task_id] = i  # a retry that went through beats an attempt that failed
    keep = [i for i in chosen.values() if not row_failed(notes[i])]
    failed = [i for i in chosen.values() if row_failed(notes[i])]
    if errors_path is not None:
        errs = table.take(failed).select([C.TASK_ID, C.NOTES]) if failed else \
            pa.table({C.TASK_ID: pa.array([], pa.string()), C.NOTES: pa.array([], pa.list_(pa.string()))})
        pq.write_table(errs, errors_path)
    if failed and not keep:  # an all-errors collection would only look like a run with nothing to detect
        reasons = Counter(n for i in failed for n in notes[i] or [] if "failed:" in n).most_common(3)
        raise AllRowsFailed(f"every row of the collection failed ({len(failed)} rows; ids and reasons in "
                            f"{errors_path or 'no errors file'}); top reasons: "
                            + ", ".join(f"{reason} x{count}" for reason, count in reasons))
    table = table.take(keep).sort_by(C.TASK_ID)
    schema = collection_schema()
    # optional columns a backend did not fill are all-null, never invented
    return pa.table({name: table.column(name).cast(schema.field(name).type) if name in table.column_names
                     else pa.nulls(table.num_rows, schema.field(name).type) for name in schema.names},
                    schema=schema)


def retryable_rows(table: pa.Table) -> dict[str, list[str]]:
    """The tasks of a collection's raw rows (every attempt, as `finalize` reads them) with no
    attempt that went through and a last failure another attempt can cure (`row_retryable`):
    task id -> that failure's notes."""
    notes = table.column(C.NOTES).to_pylist() if C.NOTES in table.column_names else [[]] * table.num_rows
    last: dict[str, list[str] | None] = {}
    for task_id, n in zip(table.column(C.TASK_ID).to_pylist(), notes):
        if last.get(task_id, ()) is not None:  # None: an attempt of this task went through
            last[task_id] = n if row_failed(n) else None
    return {t: n for t, n in last.items() if n is not None and row_retryable(n)}


def unfilled_columns(table: pa.Table) -> list[str]:
    """Collection columns with no value in any row (the backend could not fill them)."""
    return [name for name in table.column_names if table.num_rows and table.column(name).null_count == table.num_rows]


def collection_stats(table: pa.Table, seconds: float, errors_path: Path | None = None) -> dict:
    """Per-stage numbers the report shows: rows, execution outcomes by kind, the reasons rows
    were degraded (row notes: truncations, NaN losses, CodeBLEU failures), parse failures,
    and the rows that failed for good (in the errors file, by reason)."""
    from leakray.features.expert import PARSE_NOTES

    statuses = Counter(s for row in table.column(C.EXEC_STATUS).to_pylist() for s in row)
    n_tokens = [n for row in table.column(C.N_TOKENS).to_pylist() for n in row]
    notes = Counter(n for row in table.column(C.NOTES).to_pylist() for n in row or [])
    if errors_path is not None and Path(errors_path).exists():
        failed = pq.read_table(errors_path).column(C.NOTES).to_pylist()
        notes.update(n for row in failed for n in row or [] if "failed:" in n)
    from leakray.features.probes import PROBES

    probe_s = [row for row in table.column(C.PROBE_SECONDS).to_pylist() if row] \
        if C.PROBE_SECONDS in table.column_names else []
    traffic = {k: notes.pop(k) for k in list(notes) if is_traffic(k)}
    answers = {k: notes.pop(k) for k in list(notes) if k.startswith(CHAT_ANSWER)}
    return {
        **part_stats(table, sum(n_tokens), sum(statuses.values())),
        # rows that sent an endpoint requests, needed retries (by reason): what it cost to reach it, not
        # what is wrong with a row (a count of rows, each reason once per row, as for errors)
        **({"endpoint_rows": traffic} if traffic else {}),
        # rows whose chat answers had their wrapping taken off (`leakray.models.chat`): how the model
        # answered, not a fault of the row
        **({"chat_answers": answers} if answers else {}),
        # each probe's wall time over the collection (what it adds to the sampling pass)
        # (a collection made before the next-token probe has three entries per row, before the question
        # probe four)
        **({"probe_seconds": {p: round(sum(r[j] for r in probe_s if len(r) > j), 3) for j, p in enumerate(PROBES)}}
           if probe_s else {}),
        "rows": table.num_rows, "rows_out": table.num_rows, "completions": sum(statuses.values()),
        "unfilled_columns": unfilled_columns(table),
        # program outcomes (error = does not compile, timeout, memory) are in exec_status, not here
        "errors": {k: v for k, v in notes.items() if k not in PARSE_NOTES},
        "parse_failures": {k: v for k, v in notes.items() if k in PARSE_NOTES},
        "exec_status": dict(statuses), "mean_generated_tokens": round(sum(n_tokens) / max(1, len(n_tokens)), 1),
        "seconds": round(seconds, 1), "seconds_per_task": round(seconds / max(1, table.num_rows), 3),
    }


# The endpoint sampler's request counters (`EndpointSampler.stats`) that reach a row's notes with
# its other counters: its traffic, not a degradation (`collection_stats` keeps them apart).
TRAFFIC = ("requests", "retries", "failed_rows")
CHAT_ANSWER = "chat_answer_"  # the prefix of `leakray.models.chat`'s notes on how an answer was wrapped


def is_traffic(note: str) -> bool:
    return note in TRAFFIC or note.startswith("retry_")


def part_stats(table: pa.Table, generated_tokens: int, programs: int) -> dict:
    """Each part's busy seconds (summed over workers: parts on different workers overlap in wall
    time) and its throughput: generated tokens per sampling second, programs per sandbox second,
    solutions (k + the reference) per encoder second."""
    rows = [r for r in table.column(C.PART_SECONDS).to_pylist() if r] if C.PART_SECONDS in table.column_names else []
    if not rows:
        return {}
    busy = {p: round(sum(r[j] for r in rows), 2) for j, p in enumerate(PARTS)}
    k = max((len(c) for c in table.column(C.COMPLETIONS).to_pylist() if c), default=0)
    per_s = lambda n, part: round(n / busy[part], 1) if busy[part] > 0 else None  # noqa: E731
    return {"part_seconds": busy, "throughput": {
        "generated_tokens_per_s": per_s(generated_tokens, "sample"), "programs_per_s": per_s(programs, "execute"),
        "tasks_scored_per_s": per_s(len(rows), "score"), "solutions_embedded_per_s": per_s(len(rows) * (k + 1), "embed")}}


def write_collection(table: pa.Table, path: Path, stats: dict) -> None:
    pq.write_table(table, path)
    path.with_suffix(".stats.json").write_text(json.dumps(stats, indent=2))
