"""The sampling stage: k completions per prompt with perplexities, the reference's per-token
scores under the model (and the reference models), and the extra passes `ExtraColumns` switches
on (upper case, AdvPrompt's variants, the memory probes), one sampler call per kind per batch."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from leakray.models.sampler import SampleConfig
from leakray.schema import C, T
from leakray.stages.rows import (add_part_seconds, failure_note, fault_barrier, or_none, pylist, row_failed,
                                 take_load, with_columns)

LOG = logging.getLogger(__name__)
# the batched calls' kinds (`SampleStage._prefetch`) that are parts of their own (`stages.rows.PARTS`);
# every other kind is a memory probe, and the probes are one part (their split: `probe_seconds`)
EXTRA_PASSES = {"upper": "upper_case", "adv": "advprompt"}


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
        prompts, refs = pylist(batch, C.PROMPT), pylist(batch, C.REFERENCE)
        langs, keys = pylist(batch, C.LANGUAGE), pylist(batch, C.TASK_ID)
        adv = pylist(batch, C.ADV_PROMPTS) if self.extra.advprompt and C.ADV_PROMPTS in batch.column_names else None
        tests = pylist(batch, T.TESTS) if T.TESTS in batch.column_names else [""] * len(prompts)
        rows, spent = [], {p: [] for p in ("sample", "reference", *EXTRA_PASSES.values(), "probes")}
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
        load = take_load(self)
        if load and rows:
            spent["load"] = [load / len(rows)] * len(rows)
        # every batch gets the same columns (a failed row's are null), even one whose rows all failed
        out = with_columns(batch, {name: [row.get(name) for row in rows] for name in self._columns(adv is not None)})
        if self.usage_to is not None:
            write_usage(self.sampler, *self.usage_to, self._usage_name)
        return add_part_seconds(out, spent)

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
            for kind, v in pre["seconds"].items():  # the batched calls' shares: each pass's to its part
                self._spent[kind if kind == "sample" else EXTRA_PASSES.get(kind, "probes")] += v
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
               C.REF_TOKEN_SIGMA: scores.sigma, C.REF_TOKEN_RANK: scores.rank, C.PROMPT_LOGPROB: or_none(scores.context_logprob)}
        if self.ref_sampler is not None:
            (base,) = self.ref_sampler.reference_scores([prompt], [ref])
            row[C.REFMODEL_TOKEN_LOGPROBS] = base.logprobs
            row[C.REFMODEL_PROMPT_LOGPROB] = or_none(base.context_logprob)
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
            t = self._clock("upper_case", t)
        if adv_prompts is not None and not row_failed(notes):
            row[C.ADV_COMPLETIONS], row[C.ADV_PERPLEXITY] = pre["adv"] if pre is not None else \
                self._adv(adv_prompts, lang, key)
            t = self._clock("advprompt", t)
        if self.extra.probes and not row_failed(notes):
            row.update(self._probes(prompt, ref, lang, key, tests))
            self._clock("probes", t)
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
