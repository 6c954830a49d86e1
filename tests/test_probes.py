"""Text-only memory probes (issue 21): how probes are built and scored, each probe on a toy model
that memorised one solution verbatim (through the HF sampler and through an endpoint that returns
no log-probabilities), the probe detectors' column handling, the text-only composite, and an
endpoint audit's detector list (access "black box": text-only detectors only, a text-only primary)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from cgmia_data import rich_collection

from leakray.data.tasks import continuation, generation_prompt
from leakray.detect import registry
from leakray.detect.base import collection_access, missing_input
from leakray.detect.combined import choose_combiner
from leakray.errors import BadInput
from leakray.features import probes as pr
from leakray.schema import C, T, collection_schema

PROBE_DETECTORS = ("prefix_completion", "masked_span", "rewrite_preference", "next_token", "next_token_calibrated",
                   "question_next_token", "question_next_token_calibrated")
TOY_DETECTORS = ("prefix_completion", "masked_span", "rewrite_preference", "next_token",  # no reference model
                 "question_next_token")

SEEN_P = 'def count_vowels_twice(text):\n    """Count the vowels of text, doubled."""\n'
SEEN_R = SEEN_P + '    tally = 0\n    for letter in text:\n        if letter in "aeiou":\n            tally += 2\n    return tally\n'
UNSEEN_P = 'def longest_word_length(sentence):\n    """Length of the longest word of a sentence."""\n'
UNSEEN_R = UNSEEN_P + '    best = 0\n    for chunk in sentence.split():\n        best = max(best, len(chunk))\n    return best\n'


# ---- building and scoring probes ----------------------------------------------------------------

def test_prefix_probes_cut_at_word_starts_and_rebuild_the_program():
    cuts = pr.prefix_cuts(SEEN_P, SEEN_R)
    cont = continuation(SEEN_P, SEEN_R)
    assert len(cuts) == 3 and cuts == sorted(cuts) and all(0 < c < len(cont) for c in cuts)
    for c in cuts:
        assert cont[c - 1].isspace() and not cont[c].isspace()  # no token split
        given, target = pr.given_and_target(SEEN_P, SEEN_R, c)
        assert given == given.rstrip() and given + target == generation_prompt(SEEN_P) + cont
        assert given.startswith(generation_prompt(SEEN_P)) and len(given) > len(generation_prompt(SEEN_P))
    assert pr.prefix_cuts("def f():\n", "def f():\n    pass\n") == [0]  # one word: the prompt alone


def test_mask_spans_are_new_distinctive_identifiers_else_lines():
    spans = pr.mask_spans(SEEN_P, SEEN_R)
    cont = continuation(SEEN_P, SEEN_R)
    assert [s for _, s in spans] == ["tally", "letter", "aeiou"]  # text order; `text` is the prompt's
    assert all(cont[at:at + len(s)] == s for at, s in spans)
    only_common = pr.mask_spans("def f(x):\n", "def f(x):\n    return len(x) + 1\n")
    assert only_common == [(5, "return len(x) + 1")]


def test_probe_statistics_by_hand():
    # code tokens: tally = 0 for | letter; the next 5-gram needs all five
    assert pr.prefix_match("\n    tally = 0\n    for", "\n    tally = 0\n    for letter") == pytest.approx((0.0, 0.8, 0.8))
    assert pr.prefix_match("\n    tally = 0\n    for letter in", "\n    tally = 0\n    for letter in text") == \
        pytest.approx((1.0, 6 / 7, 6 / 7))
    assert pr.prefix_match("x", "\n    tally = 0")[:2] == (0.0, 0.0)
    assert pr.mask_match(" tally += 2", "tally") == 1.0
    assert pr.mask_match(" tallies", "tally") == pytest.approx(4 / 7)  # a longer word is not the name
    assert pr.mask_match("(", "tally") == 0.0
    orig, pref = pr.rewrite_preference("a = b + 1", "a = b + 1", ["c = b + 1"])
    assert orig == 1.0 and pref == pytest.approx(1 - 4 / 5)
    assert pr.rewrite_preference("a = 1", "a = 1", []) == (1.0, 0.0)  # no rewrite: no preference
    # a draw agrees when it writes the rest's next pre-token whole: " tally" and " tally =", not the
    # first letter " t" (a prefix of many continuations), an end of text "" or a longer word
    assert pr.next_agreement([" tally", " t", "", " tallies", "\n", " tally ="], " tally = 0") == 2
    # an indentation's pre-token is its whitespace but the last space: "   " of "    return"
    assert pr.next_agreement(["  ", "    ", "   ", "\n", "    return"], "    return x") == 3
    assert pr.next_agreement([" a"], "") == 0
    assert pr.next_pretoken(" tally = 0") == " tally" and pr.next_pretoken("    return x") == "   "
    assert pr.next_log_share(32, 32) > pr.next_log_share(1, 32) > pr.next_log_share(0, 32) > float("-inf")


def test_next_token_cuts_are_token_starts_and_split_the_program_exactly():
    cuts = pr.next_cuts(SEEN_P, SEEN_R)
    cont = continuation(SEEN_P, SEEN_R)
    assert cuts[0] == 0 and cuts == sorted(set(cuts)) and all(c < len(cont.rstrip()) for c in cuts)
    for c in cuts:
        given, target = pr.next_given_and_target(SEEN_P, SEEN_R, c)
        assert given + target == generation_prompt(SEEN_P) + cont  # whitespace kept: the model writes it
    targets = [pr.next_given_and_target(SEEN_P, SEEN_R, c)[1] for c in cuts]
    assert " tally = 0\n" in [t[:11] for t in targets]  # a word with the space before it
    assert not any(cont[c - 1].isalnum() and cont[c].isalnum() for c in cuts if c)  # no word split
    assert len(pr.next_cuts(SEEN_P, SEEN_R, 5)) == 5 and pr.next_cuts(SEEN_P, SEEN_R, 5)[0] == 0  # spread evenly


def test_question_cuts_are_the_prompts_token_starts_after_its_first_character():
    head = generation_prompt(SEEN_P)
    cuts = pr.question_cuts(SEEN_P, SEEN_R)
    assert cuts == sorted(set(cuts)) and 0 < cuts[0] and all(c < len(head) for c in cuts)
    assert not any(head[c - 1].isalnum() and head[c].isalnum() for c in cuts)  # no word split
    for c in cuts:
        given, target = pr.question_given_and_target(SEEN_P, SEEN_R, c)
        assert given == head[:c] and given + target == head + continuation(SEEN_P, SEEN_R)
    targets = [pr.question_given_and_target(SEEN_P, SEEN_R, c)[1] for c in cuts]
    assert any(t.startswith(" count_vowels_twice(") for t in targets)  # the function's name is a cut
    assert len(pr.question_cuts(SEEN_P, SEEN_R, 5)) == 5  # spread evenly
    assert pr.question_cuts("x") == []  # one token: nothing to continue but the start
    assert set(pr.DRAW_PROBES) == {"next", "question"} and set(pr.DRAW_PROBES) <= set(pr.PROBES)


# ---- each probe on a toy model that memorised one solution ---------------------------------------

@pytest.fixture(scope="module")
def memorised(tiny_lm, tmp_path_factory):
    from leakray.models.finetune import FinetuneConfig, finetune

    out = tmp_path_factory.mktemp("memorised") / "model"
    finetune(tiny_lm[0], [SEEN_R], FinetuneConfig(method="full", epochs=20, lr=1e-2, seed=0), out, progress=False)
    return str(out)


def _tasks() -> pa.Table:
    from leakray.stages.collect import input_table

    rows = [{T.TASK_ID: tid, T.BENCHMARK: "toy", T.LANGUAGE: "python", T.PROMPT: p, T.REFERENCE: r, T.TESTS: "",
             T.RUNNER: "python"} for tid, p, r in (("seen", SEEN_P, SEEN_R), ("unseen", UNSEEN_P, UNSEEN_R))]
    return input_table(rows, {}, {"seen"})


def _probe_collection(model: str, sample) -> pa.Table:
    from leakray.stages.collect import finalize
    from leakray.stages.sample import ExtraColumns, SampleStage

    stage = SampleStage(model, sample, ExtraColumns(probes=pr.PROBES, probe_tokens=32))
    return finalize(stage(_tasks()))


def _seen_above_unseen(table: pa.Table) -> None:
    assert table.column(C.TASK_ID).to_pylist() == ["seen", "unseen"]
    for name in TOY_DETECTORS:
        seen, unseen = registry.make(name).score(table)
        assert seen > unseen, (name, seen, unseen)
    seconds = table.column(C.PROBE_SECONDS).to_pylist()
    assert all(len(s) == len(pr.PROBES) and min(s) > 0 for s in seconds)  # every probe ran and was timed


def test_each_probe_scores_a_memorised_task_above_an_unseen_one(memorised):
    from leakray.models.sampler import SampleConfig
    from leakray.stages.collect import collection_stats

    table = _probe_collection(memorised, SampleConfig(k=1, max_new_tokens=48))
    _seen_above_unseen(table)
    seen = table.to_pylist()[0]
    assert len(seen[C.PREFIX_CUTS]) == len(seen[C.PREFIX_COMPLETIONS]) == 3
    assert seen[C.MASK_SPANS] == ["tally", "letter", "aeiou"] and len(seen[C.MASK_COMPLETIONS]) == 3
    assert len(seen[C.REWRITES]) == pr.N_REWRITES and continuation(SEEN_P, SEEN_R) not in seen[C.REWRITES]
    assert seen[C.NEXT_CUTS] == pr.next_cuts(SEEN_P, SEEN_R)
    assert [len(d) for d in seen[C.NEXT_DRAWS]] == [pr.NEXT_DRAWS] * len(seen[C.NEXT_CUTS])
    assert seen[C.QUESTION_CUTS] == pr.question_cuts(SEEN_P, SEEN_R)
    assert [len(d) for d in seen[C.QUESTION_DRAWS]] == [pr.NEXT_DRAWS] * len(seen[C.QUESTION_CUTS])
    assert collection_access(table) == "weights"
    table = table.set_column(table.schema.get_field_index(C.EXEC_STATUS), C.EXEC_STATUS,
                             pa.array([[]] * 2, pa.list_(pa.string())))
    table = table.set_column(table.schema.get_field_index(C.N_TOKENS), C.N_TOKENS,
                             pa.array([[]] * 2, pa.list_(pa.int32())))
    stats = collection_stats(table, 1.0)
    assert set(stats["probe_seconds"]) == set(pr.PROBES) and min(stats["probe_seconds"].values()) > 0
    # the probes are a part of the collection's own (stages.rows.PARTS), the other extra passes off here
    parts = stats["part_seconds"]
    assert parts["probes"] >= sum(stats["probe_seconds"].values()) - 0.01 and parts["upper_case"] == parts["advprompt"] == 0


def test_the_greedy_probe_takes_advprompts_base_completion_instead_of_decoding_it_again(memorised, monkeypatch):
    """With AdvPrompt's pass in the batch, its base slot (the unperturbed prompt, greedy) is the
    greedy probe's request: taken from there, never decoded twice, and the same text as the probe
    decoding it alone. A row whose base slot is not its prompt is still decoded by the probe."""
    from leakray.models.hf_sampler import HFSampler
    from leakray.models.sampler import SampleConfig
    from leakray.stages.collect import finalize
    from leakray.stages.rows import PARTS
    from leakray.stages.sample import ExtraColumns, SampleStage

    sample = SampleConfig(k=1, max_new_tokens=48)
    tasks = _tasks()
    renamed = UNSEEN_P.replace("sentence", "words")
    # the seen task's slots: its own prompt, then a variant; the unseen one's base slot is not its prompt
    adv = [[SEEN_P, SEEN_P.replace("text", "string")], [renamed]]
    tasks = tasks.append_column(C.ADV_PROMPTS, pa.array(adv, pa.list_(pa.string())))
    probed: list[list[str]] = []
    original = HFSampler.greedy_probe

    def spy(self, prompts, languages, keys, max_new_tokens):
        probed.append(list(prompts))
        return original(self, prompts, languages, keys, max_new_tokens)

    monkeypatch.setattr(HFSampler, "greedy_probe", spy)
    stage = SampleStage(memorised, sample, ExtraColumns(advprompt=True, probes=("greedy",)))
    rows = finalize(stage(tasks)).to_pylist()
    assert probed == [[UNSEEN_P]]  # the seen task's prompt was decoded once, in AdvPrompt's pass
    # each pass's time in its own part: AdvPrompt's completions apart from the probe's (stages.rows.PARTS)
    parts = [dict(zip(PARTS, r[C.PART_SECONDS])) for r in rows]
    assert all(p["advprompt"] > 0 and p["probes"] > 0 and p["upper_case"] == 0 for p in parts)
    monkeypatch.setattr(HFSampler, "greedy_probe", original)
    sampler = HFSampler(memorised, sample)  # each prompt alone, as the probe's own call decodes it
    alone = [sampler.greedy_probe([p], ["python"], [key], 48)[0] for p, key in ((SEEN_P, "seen"), (UNSEEN_P, "unseen"))]
    assert [r[C.GREEDY_COMPLETION] for r in rows] == alone
    assert rows[0][C.GREEDY_COMPLETION] == rows[0][C.ADV_COMPLETIONS][0] and "tally" in alone[0]  # memorised


def test_probes_through_an_endpoint_without_logprobs(memorised):
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.models.sampler import SampleConfig

    with CompletionServer(HFBackend(memorised, no_logprobs="ignore")) as srv:
        table = _probe_collection(memorised, SampleConfig(backend="openai", endpoint_url=srv.url, k=1,
                                                          max_new_tokens=48, max_retries=0))
        probe_requests = srv.count(lambda body: body.get("temperature") == 0.0 and "logprobs" not in body)
        draw_requests = srv.count(lambda body: body.get("max_tokens") == 1 and body.get("temperature") == 1.0
                                  and body.get("n") == pr.NEXT_DRAWS and "logprobs" not in body)
    assert collection_access(table) == "black box"  # text only: no reference scores, NaN perplexities
    assert table.column(C.REF_TOKEN_LOGPROBS).null_count == 2
    _seen_above_unseen(table)
    n_texts = sum(len(r[C.PREFIX_CUTS]) + len(r[C.MASK_SPANS]) + 1 for r in table.to_pylist())
    assert probe_requests == n_texts  # one greedy request per probe text, none asking for log-probs
    # row by row (an endpoint does not batch tasks): each row's probes part holds its probes' own seconds
    from leakray.stages.rows import PARTS

    for r in table.to_pylist():
        parts = dict(zip(PARTS, r[C.PART_SECONDS]))
        assert parts["probes"] >= sum(r[C.PROBE_SECONDS]) - 1e-3 > 0 and parts["advprompt"] < parts["probes"]
    # one per cut of either sampled probe, n draws each
    assert draw_requests == sum(len(r[C.NEXT_CUTS]) + len(r[C.QUESTION_CUTS]) for r in table.to_pylist())


def test_hf_draws_from_one_shared_pass_are_those_of_a_pass_per_text(tiny_lm, monkeypatch):
    """A key's cuts read the longest text's logits in one pass; replacing that pass by one pass per
    text (each prefix alone) draws the same tokens: the same generator, the same distributions."""
    import torch

    from leakray.models.hf_sampler import HFSampler
    from leakray.models.sampler import SampleConfig

    s = HFSampler(str(tiny_lm[0]), SampleConfig(k=1, max_new_tokens=8))
    texts = [pr.next_given_and_target(SEEN_P, SEEN_R, c)[0] for c in pr.next_cuts(SEEN_P, SEEN_R, 8)]
    real, passes = s._next_logits, []
    monkeypatch.setattr(s, "_next_logits", lambda ids, pos: passes.append(len(pos)) or real(ids, pos))
    shared = s.next_token_draws(texts, ["seen"] * len(texts), 16)
    assert passes == [len(texts)]  # one forward pass for the task's cuts
    assert [len(d) for d in shared] == [16] * len(texts) and all(isinstance(x, str) for d in shared for x in d)
    monkeypatch.setattr(s, "_next_logits", lambda ids, pos: torch.stack([real(ids[:p + 1], [p])[0] for p in pos]))
    assert s.next_token_draws(texts, ["seen"] * len(texts), 16) == shared
    assert s.next_token_draws(texts, ["other"] * len(texts), 16) != shared  # the key seeds the draws


# ---- column handling ------------------------------------------------------------------------------

def with_probes(table: pa.Table, signal: bool = True) -> pa.Table:
    """``table`` (prompts, references, members) plus the probe columns: members' continuations are
    the true ones (when ``signal``), non-members' another task's."""
    rows = table.select([C.TASK_ID, C.PROMPT, C.REFERENCE, C.MEMBER]).to_pylist()
    cols = {c: [] for c in (C.PREFIX_CUTS, C.PREFIX_COMPLETIONS, C.MASK_SPANS, C.MASK_COMPLETIONS,
                            C.GREEDY_COMPLETION, C.REWRITES, C.NEXT_CUTS, C.NEXT_DRAWS, C.REFMODEL_NEXT_DRAWS,
                            C.QUESTION_CUTS, C.QUESTION_DRAWS, C.REFMODEL_QUESTION_DRAWS, C.PROBE_SECONDS)}
    for i, r in enumerate(rows):
        p, ref = r[C.PROMPT], r[C.REFERENCE]
        other = rows[(i + 1) % len(rows)]
        knows = signal and r[C.MEMBER] == 1
        cuts = pr.prefix_cuts(p, ref)
        spans = pr.mask_spans(p, ref)
        cols[C.PREFIX_CUTS].append(cuts)
        cols[C.PREFIX_COMPLETIONS].append([pr.given_and_target(p, ref, c)[1] if knows else
                                           continuation(other[C.PROMPT], other[C.REFERENCE]) for c in cuts])
        cols[C.MASK_SPANS].append([s for _, s in spans])
        cols[C.MASK_COMPLETIONS].append([" " + s if knows else " value" for _, s in spans])
        cols[C.GREEDY_COMPLETION].append(continuation(p, ref) if knows else
                                         continuation(other[C.PROMPT], other[C.REFERENCE]))
        cols[C.REWRITES].append(pr.rewrite_continuations(p, ref, "", r[C.TASK_ID]))
        nexts = [pr.next_pretoken(pr.next_given_and_target(p, ref, c)[1]) for c in pr.next_cuts(p, ref, 16)]
        cols[C.NEXT_CUTS].append(pr.next_cuts(p, ref, 16))
        # members' draws are mostly the true next pre-token, everyone else's half the time; the
        # reference model's draws are half right for every task
        cols[C.NEXT_DRAWS].append([[t] * 3 + ["\x00"] if knows else [t, t, "\x00", "\x00"] for t in nexts])
        cols[C.REFMODEL_NEXT_DRAWS].append([[t, t, "\x00", "\x00"] for t in nexts])
        qcuts = pr.question_cuts(p, ref, 16)
        asked = [pr.next_pretoken(pr.question_given_and_target(p, ref, c)[1]) for c in qcuts]
        cols[C.QUESTION_CUTS].append(qcuts)
        cols[C.QUESTION_DRAWS].append([[t] * 3 + ["\x00"] if knows else [t, t, "\x00", "\x00"] for t in asked])
        cols[C.REFMODEL_QUESTION_DRAWS].append([[t, t, "\x00", "\x00"] for t in asked])
        cols[C.PROBE_SECONDS].append([0.1] * len(pr.PROBES))
    sch = collection_schema()
    for name, values in cols.items():
        table = table.append_column(sch.field(name), pa.array(values, sch.field(name).type))
    return table


def _auc(table, name):
    from sklearn.metrics import roc_auc_score

    return roc_auc_score(table.column(C.MEMBER).to_numpy(), registry.make(name).score(table))


@pytest.mark.parametrize("name", PROBE_DETECTORS)
def test_probe_detectors_find_their_signal_and_skip_without_columns(name):
    table = with_probes(rich_collection(n=60, seed=2, signal=0.0))
    assert _auc(table, name) > 0.9
    assert abs(_auc(with_probes(rich_collection(n=60, seed=2, signal=0.0), signal=False), name) - 0.5) < 0.2
    spec = registry.spec(name)
    assert spec.access == "black box" and spec.family == "generation" and not spec.learns
    bare = rich_collection(n=10, seed=3)
    assert "lacks column" in missing_input(bare, spec.columns)
    empty = with_probes(bare)
    col = spec.columns[-1]
    empty = empty.set_column(empty.schema.get_field_index(col), col,
                             pa.nulls(empty.num_rows, collection_schema().field(col).type))
    assert "is empty" in missing_input(empty, spec.columns)
    one_null = with_probes(bare)
    values = one_null.column(col).to_pylist()
    values[4] = None
    one_null = one_null.set_column(one_null.schema.get_field_index(col), col,
                                   pa.array(values, collection_schema().field(col).type))
    with pytest.raises(BadInput, match="row 4"):
        registry.make(name).score(one_null)


def test_probe_detector_statistics_are_parameters():
    table = with_probes(rich_collection(n=20, seed=2, signal=0.0))
    for stat in ("ngram", "lcp", "edit"):
        assert registry.make("prefix_completion", {"statistic": stat}).score(table).shape == (20,)
    orig = registry.make("rewrite_preference", {"statistic": "original"}).score(table)
    assert np.all((orig >= 0) & (orig <= 1))
    with pytest.raises(BadInput):
        registry.make("prefix_completion", {"statistic": "bleu"})


def test_text_combined_uses_text_only_inputs_and_composites_take_the_probes():
    shadow = with_probes(rich_collection(n=80, seed=1, signal=0.3))
    target = black_box(with_probes(rich_collection(n=40, seed=2, prefix="u", signal=0.3)))
    det = registry.make("text_combined").fit(shadow, 0)
    assert det.info["groups_used"]["probes"] == ["prefix", "mask", "greedy", "next", "next_calibrated", "question",
                                                      "question_calibrated"]
    assert set(det.info["groups_used"]) == {"text_expert", "semantic", "text_generation", "probes"}
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(target.column(C.MEMBER).to_numpy(), det.score(target)) > 0.8  # no logprob column read
    full = registry.make("leakray_combined").fit(shadow, 0)
    assert full.info["groups_used"]["probes"] == ["prefix", "mask", "greedy", "next", "next_calibrated", "question",
                                                      "question_calibrated"]
    with pytest.raises(BadInput, match="groups must be"):
        registry.make("text_combined", {"groups": ["likelihood"]})



def test_unit_combiner_weighs_inputs_by_their_shadow_auc_and_saves_as_json(tmp_path):
    from sklearn.metrics import roc_auc_score

    from leakray.detect.combined import UnitWeights

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 100)
    x = np.stack([y + rng.normal(0, 1, 200),        # strong
                  -1.0 * y + rng.normal(0, 1, 200),  # reversed: a negative weight
                  rng.normal(0, 1, 200)], axis=1)    # noise: left out (within the margin of chance)
    u = UnitWeights(margin=0.1).fit(x, y)
    aucs = [roc_auc_score(y, x[:, j]) for j in range(3)]
    assert u.w[0] == pytest.approx(aucs[0] - 0.5) and u.w[1] == pytest.approx(aucs[1] - 0.5) and u.w[1] < 0
    assert (abs(aucs[2] - 0.5) < 0.1) == (u.w[2] == 0)
    p = u.predict_proba(x)[:, 1]
    assert np.all((p > 0) & (p < 1)) and roc_auc_score(y, p) > aucs[0]  # the reversed input adds to the strong one
    only = UnitWeights(margin=0.49).fit(x, y)  # nothing clears the margin: the best input alone is kept
    assert np.count_nonzero(only.w) == 1 and np.array_equal(np.argsort(only.predict_proba(x)[:, 1]),
                                                              np.argsort(x[:, 0]))

    shadow = with_probes(rich_collection(n=80, seed=1, signal=0.3))
    target = black_box(with_probes(rich_collection(n=40, seed=2, prefix="u", signal=0.3)))
    det = registry.make("text_combined", {"combiner": "unit"}).fit(shadow, 0)
    assert det.info["combiner"] == "unit" and len(det.info["unit_weights"]) == det.info["n_features"]
    assert roc_auc_score(target.column(C.MEMBER).to_numpy(), det.score(target)) > 0.8
    det.save(tmp_path / "d")
    assert (tmp_path / "d" / "unit_weights.json").exists() and not list((tmp_path / "d").glob("*.skops"))
    np.testing.assert_array_equal(registry.load(tmp_path / "d").score(target), det.score(target))
    # auto (the default): both combiners cross-fitted on the shadow, the higher out-of-fold AUC kept
    auto = registry.make("text_combined").fit(shadow, 0)
    oof = auto.info["oof_auc"]
    assert set(oof) == {"logistic", "unit", "pooled"} and auto.info["combiner"] == choose_combiner(oof, 40, 40)
    y_oof, s_oof, _ = auto.heldout(shadow)
    assert roc_auc_score(y_oof, s_oof) == pytest.approx(oof[auto.info["combiner"]])
    # a second reference model's draws (simulate's non-oracle reference) add their own calibration
    alt = shadow.append_column(collection_schema().field(C.REFALT_NEXT_DRAWS), shadow.column(C.REFMODEL_NEXT_DRAWS))
    both = registry.make("text_combined").fit(alt, 0)
    assert both.info["groups_used"]["probes"] == ["prefix", "mask", "greedy", "next", "next_calibrated",
                                                  "next_calibrated_alt", "question", "question_calibrated"]
    with pytest.raises(BadInput, match="combiner must be"):
        registry.make("text_combined", {"combiner": "forest"})

def test_auto_keeps_the_simplest_combiner_within_one_standard_error_of_the_best():
    from leakray.evaluate.metrics import auc_standard_error

    # Hanley & McNeil's standard error: at chance on 41 + 41 tasks the Mann-Whitney null's 0.064
    assert auc_standard_error(0.5, 41, 41) == pytest.approx(np.sqrt(83 / (12 * 41 * 41)), rel=0.01)
    assert auc_standard_error(1.0, 41, 41) == 0.0 and auc_standard_error(0.9, 41, 41) < auc_standard_error(0.7, 41, 41)
    # a faint shadow: a learned lead of 0.04 is within one standard error (0.058 at 0.70): pooled
    assert choose_combiner({"logistic": 0.70, "unit": 0.68, "pooled": 0.66}, 41, 41) == "pooled"
    assert choose_combiner({"logistic": 0.75, "unit": 0.70, "pooled": 0.60}, 41, 41) == "unit"
    # a strong leak's clear lead stands; ties go to the simplest
    assert choose_combiner({"logistic": 0.99, "unit": 0.90, "pooled": 0.85}, 41, 41) == "logistic"
    assert choose_combiner({"logistic": 1.0, "unit": 1.0, "pooled": 1.0}, 41, 41) == "pooled"
    assert choose_combiner({"logistic": 0.70, "unit": 0.69}, 41, 41) == "unit"  # no draws: no pooled


def test_pooled_combiner_averages_the_probes_calibrated_readings_and_nothing_else(tmp_path):
    from sklearn.metrics import roc_auc_score

    from leakray.detect.combined import PooledWeights

    rng = np.random.default_rng(1)
    y = np.repeat([0, 1], 41)
    latent = y * 0.5  # a faint leak, read by three noisy pooled inputs
    x = np.stack([latent + rng.normal(0, 1, 82) for _ in range(3)]
                 + [-1.5 * y + rng.normal(0, 1, 82),  # strong and reversed on this shadow: not pooled, left out
                    rng.normal(0, 1, 82)], axis=1)  # noise: left out
    x[:, 0] -= 0.6 * y  # on this shadow the first pooled input points the wrong way: it is kept anyway
    pooled = np.array([True, True, True, False, False])
    u = PooledWeights(pooled).fit(x, y)
    assert list(u.w) == [1.0, 1.0, 1.0, 0.0, 0.0]
    # with a screen (leakray_combined's): the strong input enters, reversed; the noise does not
    assert list(PooledWeights(pooled, 1.96).fit(x, y).w) == [1.0, 1.0, 1.0, -1.0, 0.0]
    # on a target where each reads the leak alike, the three readings' average beats every one alone
    y_t = np.repeat([0, 1], 200)
    x_t = np.stack([y_t * 0.5 + rng.normal(0, 1, 400) for _ in range(3)] + [rng.normal(0, 1, 400)] * 2, axis=1)
    assert roc_auc_score(y_t, u.predict_proba(x_t)[:, 1]) > max(roc_auc_score(y_t, x_t[:, j]) for j in range(3))
    only_noise = PooledWeights(np.zeros(1, bool)).fit(rng.normal(0, 1, (82, 1)), y)
    assert np.count_nonzero(only_noise.w) == 1  # never an empty combination

    shadow = with_probes(rich_collection(n=80, seed=1, signal=0.3))
    target = black_box(with_probes(rich_collection(n=40, seed=2, prefix="u", signal=0.3)))
    det = registry.make("text_combined", {"combiner": "pooled"}).fit(shadow, 0)
    mask = det.model.pooled
    # one reading per probe, its draws against the reference model: not the raw shares
    assert det.info["combiner"] == "pooled" and det.info["pooled_inputs"] == ["next_calibrated", "question_calibrated"]
    assert mask.sum() == 2 and np.all(det.model.w[mask] == 1.0) and not det.model.w[~mask].any()
    assert len(mask) == det.info["n_features"]
    assert roc_auc_score(target.column(C.MEMBER).to_numpy(), det.score(target)) > 0.8
    det.save(tmp_path / "p")
    np.testing.assert_array_equal(registry.load(tmp_path / "p").score(target), det.score(target))
    assert set(registry.make("text_combined").fit(shadow, 0).info["oof_auc"]) == {"logistic", "unit", "pooled"}
    # leakray_combined pools every sampled statistic, the raw shares too, and screens the rest
    every = registry.make("leakray_combined", {"combiner": "pooled"}).fit(shadow, 0)
    assert every.info["pooled_inputs"] == ["next", "next_calibrated", "question", "question_calibrated"]
    assert every.model.z == 1.96
    # a second reference's draws beside the first: the first's calibration is the reading; only the
    # second's (its draws where the collection's reference model drew none): the second's
    field = collection_schema().field(C.REFALT_NEXT_DRAWS)
    both = shadow.append_column(field, shadow.column(C.REFMODEL_NEXT_DRAWS))
    assert registry.make("text_combined", {"combiner": "pooled"}).fit(both, 0).info["pooled_inputs"] == \
        ["next_calibrated", "question_calibrated"]
    alt_only = both.drop_columns([C.REFMODEL_NEXT_DRAWS])
    assert registry.make("text_combined", {"combiner": "pooled"}).fit(alt_only, 0).info["pooled_inputs"] == \
        ["next_calibrated_alt", "question_calibrated"]
    # a collection without sampled probes: auto does not offer pooled
    bare = shadow.drop_columns([C.NEXT_CUTS, C.NEXT_DRAWS, C.REFMODEL_NEXT_DRAWS, C.QUESTION_CUTS,
                                C.QUESTION_DRAWS, C.REFMODEL_QUESTION_DRAWS])
    assert set(registry.make("text_combined").fit(bare, 0).info["oof_auc"]) == {"logistic", "unit"}


# ---- the audit of an endpoint without log-probabilities -------------------------------------------

def _nulled(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    sch = collection_schema()
    for name in names:
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, pa.nulls(table.num_rows,
                                                                                        sch.field(name).type))
    return table


# what an endpoint that scores no given text (no `echo`) leaves empty: every score of the reference
NO_ECHO = (C.REF_LOSS, C.REF_TOKEN_LOGPROBS, C.REF_TOKEN_MU, C.REF_TOKEN_SIGMA, C.REF_TOKEN_RANK, C.PROMPT_LOGPROB)


def black_box(table: pa.Table) -> pa.Table:
    """What a text-only endpoint's collection holds: no reference scores, NaN perplexities."""
    sch = collection_schema()
    table = _nulled(table, NO_ECHO + (C.REFMODEL_TOKEN_LOGPROBS, C.UPPER_PERPLEXITY))
    k = len(table.column(C.PERPLEXITY)[0].as_py())
    if C.ADV_PERPLEXITY in table.column_names:
        table = table.set_column(table.schema.get_field_index(C.ADV_PERPLEXITY), C.ADV_PERPLEXITY,
                                 pa.array([[float("nan")] * 12] * table.num_rows, sch.field(C.ADV_PERPLEXITY).type))
    for name, width in ((C.PERPLEXITY, k), (C.EXPERT, 4 * k)):
        values = [[float("nan")] * k + row[k:] if name == C.EXPERT else [float("nan")] * width
                  for row in table.column(name).to_pylist()]
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, sch.field(name).type))
    return table


def with_adv(table: pa.Table, seed: int) -> pa.Table:
    """AdvPrompt's columns on a rich collection: members' perturbed completions stay near the
    reference embedding, non-members' drift (as tests/test_perturb_stage.py's collection)."""
    rng = np.random.default_rng(seed)
    ref = np.asarray(table.column(C.REF_EMBEDDING).to_pylist())
    member = table.column(C.MEMBER).to_numpy()
    n, d = ref.shape
    emb = ref[:, None, :] + np.where(member == 1, 0.3, 1.0)[:, None, None] * rng.normal(size=(n, 12, d)) * 1.5
    sch = collection_schema()
    cols = {C.ADV_KIND: [["base"] + [f"S{j}" for j in range(11)]] * n,
            C.ADV_PERPLEXITY: np.exp(rng.normal(size=(n, 12)) * 0.3).tolist(),
            C.ADV_EMBEDDING: emb.reshape(n, -1).tolist()}
    for name, values in cols.items():
        table = table.append_column(sch.field(name), pa.array(values, sch.field(name).type))
    return table


def test_endpoint_audit_runs_every_text_only_detector_with_a_text_only_primary(tmp_path):
    from leakray.config import AUDIT_DEFAULTS, AuditConfig, load_config
    from leakray.protocols.card import build_card
    from leakray.report.audit import by_access, choose_primary

    names = ["ref_loss", "min_k", "detectleak", "gt_match", "cdd", *PROBE_DETECTORS, "text_combined",
             "leakray_combined", "advprompt", "advprompt_text"]
    small = "{epochs: 4, batch_size: 16}"  # the paper's 25 epochs of 4 rows are not what this test checks
    cfg = load_config([AUDIT_DEFAULTS], [f"detect.detectors=[{','.join(names)}]", "detect.use_ray_train=false",
                                         "detect.bootstrap=20",
                                         f"detect.params={{advprompt: {{config: {small}}}, "
                                         f"advprompt_text: {{config: {small}}}}}"], AuditConfig)
    shadow = with_adv(with_probes(rich_collection(n=80, seed=1, signal=0.6)), 1)
    card = build_card(shadow, cfg, tmp_path / "card", storage=tmp_path / "ray", meta={"benchmark": {"name": "x"}})
    assert set(card.names) == set(names)

    target = black_box(with_adv(with_probes(rich_collection(n=40, seed=2, prefix="u", signal=0.6)), 2))
    access, allowed, skipped = by_access(card, target)
    # AdvPrompt-MIA runs through text alone on its similarity features; the full one needs the perplexities
    text_only = {"gt_match", "cdd", *PROBE_DETECTORS, "text_combined", "advprompt_text"}
    assert access == "black box" and set(allowed) == text_only
    assert set(skipped) == {"ref_loss", "min_k", "detectleak", "leakray_combined", "advprompt"}
    assert {n: why for n, why in skipped.items() if "the target gives black box" in why} == {
        n: f"needs {registry.spec(n).access} access; the target gives black box" for n in skipped}
    assert {registry.spec(n).access for n in skipped} == {"logprobs", "sampled logprobs"}
    scores, unusable = card.score(target, allowed)
    assert set(scores) == text_only and not unusable
    primary = choose_primary(card, list(scores), None)
    assert registry.spec(primary).access == "black box"
    # the same card on a target with log-probabilities runs everything
    assert by_access(card, with_probes(rich_collection(n=20, seed=4, prefix="w")))[0] == "weights"
    assert card.score(target, [])[0] == {}  # an empty selection is empty, not "all"

    # an endpoint that returns the log-probabilities of what it samples but scores no given text
    # (refuses `echo`): the detectors reading the completions' perplexities run too, the ones
    # reading the reference's log-probabilities do not
    sampled = _nulled(with_adv(with_probes(rich_collection(n=40, seed=3, prefix="v", signal=0.6)), 3), NO_ECHO)
    access, allowed, skipped = by_access(card, sampled)
    assert access == "sampled logprobs" and set(allowed) == text_only | {"detectleak", "advprompt"}
    assert set(skipped) == {"ref_loss", "min_k", "leakray_combined"}
    assert all("needs logprobs access; the target gives sampled logprobs" in why for why in skipped.values())
    scores, unusable = card.score(sampled, allowed)
    assert set(scores) == set(allowed) and not unusable
    assert registry.spec(choose_primary(card, list(scores), None)).access in ("black box", "sampled logprobs")


def test_an_endpoint_without_echo_gives_sampled_logprobs_access(memorised):
    """A hosted API that returns the log-probabilities of what it generates but refuses `echo`
    (scores no given text): perplexities of the samples, no reference scores, and the access
    level that says so."""
    from leakray.models.endpoint_sampler import REF_LOSS_UNSUPPORTED
    from leakray.models.endpoint_server import CompletionServer, HFBackend
    from leakray.models.sampler import SampleConfig
    from leakray.stages.collect import finalize
    from leakray.stages.sample import SampleStage

    refuse_echo = lambda body, _: "400:echo is not supported for this model" if body.get("echo") else None  # noqa: E731
    with CompletionServer(HFBackend(memorised), fault=refuse_echo) as srv:
        stage = SampleStage(memorised, SampleConfig(backend="openai", endpoint_url=srv.url, k=2, max_new_tokens=16,
                                                    max_retries=0))
        table = finalize(stage(_tasks()))
        echoed = srv.count(lambda body: bool(body.get("echo")))
    assert echoed >= 1  # asked, refused, not retried as a failure
    assert collection_access(table) == "sampled logprobs"
    assert table.column(C.REF_TOKEN_LOGPROBS).null_count == 2
    assert all(math.isfinite(v) for row in table.column(C.PERPLEXITY).to_pylist() for v in row)
    assert all(REF_LOSS_UNSUPPORTED in notes for notes in table.column(C.NOTES).to_pylist())


def test_vllm_probe_is_one_greedy_call_without_logprobs(monkeypatch, tmp_path):
    """Through the stand-in `vllm` of tests/test_vllm_sampler.py (no GPU here)."""
    import sys
    import types
    from types import SimpleNamespace as NS

    from test_vllm_sampler import _LLM

    from leakray.models.sampler import SampleConfig

    seen = []
    mod = types.ModuleType("vllm")
    mod.LLM = _LLM
    mod.SamplingParams = lambda **kw: seen.append(kw) or NS(**{"prompt_logprobs": None, **kw})
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path))
    from leakray.models.vllm_sampler import VLLMSampler

    s = VLLMSampler("base", SampleConfig(k=3, max_new_tokens=64, max_model_len=256))
    texts = [pr.given_and_target(SEEN_P, SEEN_R, c)[0] for c in pr.prefix_cuts(SEEN_P, SEEN_R)]
    got = s.greedy_probe(texts, ["python"] * 3, ["seen"] * 3, 16)
    assert got == ["\n    return 1\n"] * 3 and s.llm.calls[-1][0] == 3  # one call for the task's texts
    assert all(p["n"] == 1 and p["temperature"] == 0.0 and p["max_tokens"] == 16 and p["logprobs"] is None
               for p in seen[-3:])
    texts = [pr.next_given_and_target(SEEN_P, SEEN_R, c)[0] for c in pr.next_cuts(SEEN_P, SEEN_R, 4)]
    draws = s.next_token_draws(texts, ["seen"] * 4, 5)
    assert draws == [["\n"] * 5] * 4 and s.llm.calls[-1][0] == 4  # one call; the stand-in writes "\n" first
    assert all(p["n"] == 5 and p["temperature"] == 1.0 and p["top_p"] == 1.0 and p["max_tokens"] == 1
               and p["logprobs"] is None and "stop" not in p for p in seen[-4:])


def test_oracle_and_non_oracle_references_score_side_by_side(memorised, tiny_lm):
    """simulate's two references: the oracle (the memorised model's own base) and a second one
    filled into its own column; with the same model as both, the two detectors agree exactly,
    and the memorised task stands out against its base."""
    from leakray.models.sampler import SampleConfig
    from leakray.stages.collect import finalize
    from leakray.stages.sample import ExtraColumns, SampleStage

    base = str(tiny_lm[0])
    stage = SampleStage(memorised, SampleConfig(k=1, max_new_tokens=8),
                        ExtraColumns(reference_model=base, alt_reference_model=base))
    table = finalize(stage(_tasks()))
    assert table.column(C.REFALT_TOKEN_LOGPROBS).to_pylist() == table.column(C.REFMODEL_TOKEN_LOGPROBS).to_pylist()
    oracle = registry.make("ref_calibrated").score(table)
    np.testing.assert_allclose(registry.make("ref_calibrated_nonoracle").score(table), oracle)
    assert oracle[0] > oracle[1]
