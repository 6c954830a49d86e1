"""The batched decoding loop (leakray.models.decode) against transformers' own generate."""

from __future__ import annotations

import pytest
import torch

from leakray.models.decode import Request, _chunks, _top_p, _top_p_sorted, decode

PROMPTS = ['def add(a, b):\n    """Return a + b."""\n', "def mul(a, b):\n",
           'class Box:\n    """A box."""\n\n    def size(self):\n', "import os\n\n\ndef walk(path):\n"]


@pytest.fixture(scope="module")
def lm(tiny_lm):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm[0])
    model = AutoModelForCausalLM.from_pretrained(tiny_lm[0]).eval()
    return tok, model


def _decode(tok, model, requests, **kw):
    kw.setdefault("end_ids", set(tok.all_special_ids))
    return decode(model, requests, pad_id=tok.pad_token_id,
                  detokenize=lambda ids: tok.decode(ids, skip_special_tokens=True), **kw)


def test_greedy_decoding_equals_generate_with_the_same_stops(lm):
    tok, model = lm
    stops = ["\ndef ", "\nclass "]
    reqs = [Request([tok(p)["input_ids"]], 1, True, 0, 24, stops) for p in PROMPTS]
    got = _decode(tok, model, reqs)
    for p, per_req in zip(PROMPTS, got):
        ids = torch.tensor([tok(p)["input_ids"]])
        with torch.inference_mode():
            ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=24, stop_strings=stops, tokenizer=tok,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        want = ref[0, ids.shape[1]:].tolist()
        (seq,) = per_req[0]
        assert seq.ids == want[:len(seq.ids)]  # generate pads after its end: the same tokens up to ours
        assert all(t == tok.pad_token_id for t in want[len(seq.ids):])


def test_a_sequence_leaves_the_batch_the_step_it_ends(lm, monkeypatch):
    """The work is the tokens generated: every decoding step's batch holds only live sequences."""
    tok, model = lm
    rows = []
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: rows.append(kw["input_ids"].shape[0]) or real(*a, **kw))
    budgets = [3, 9, 17]
    reqs = [Request([tok(PROMPTS[0])["input_ids"]], 1, True, 0, b) for b in budgets]
    got = _decode(tok, model, reqs, end_ids=set())
    lengths = [len(per_req[0][0].ids) for per_req in got]
    assert lengths == budgets  # no stop strings, no end token: each runs to its budget
    steps = rows[1:]  # after the one prefill
    assert sum(steps) == sum(lengths) - len(lengths)  # the last token of each needs no forward pass
    assert steps[0] == 3 and steps[-1] == 1


def test_samples_of_a_request_do_not_depend_on_its_batch_mates_or_chunking(lm):
    tok, model = lm
    mine = Request([tok(PROMPTS[1])["input_ids"]], 4, False, 123, 12)
    others = [Request([tok(p)["input_ids"]], 3, False, 7 + i, 20) for i, p in enumerate(PROMPTS)]
    alone = _decode(tok, model, [mine], temperature=1.3, top_p=0.9)[0]
    mates = _decode(tok, model, [others[0], mine, *others[1:]], temperature=1.3, top_p=0.9)[1]
    chunked = _decode(tok, model, [others[0], mine, *others[1:]], temperature=1.3, top_p=0.9, max_sequences=4)[1]
    assert [g.ids for g in alone[0]] == [g.ids for g in mates[0]] == [g.ids for g in chunked[0]]
    assert len({tuple(g.ids) for g in alone[0]}) > 1  # sampled, not four copies
    other_seed = _decode(tok, model, [Request(mine.prompts, 4, False, 124, 12)], temperature=1.3, top_p=0.9)[0]
    assert [g.ids for g in other_seed[0]] != [g.ids for g in alone[0]]


def test_logprobs_are_of_the_raw_model(lm):
    tok, model = lm
    ids = tok(PROMPTS[0])["input_ids"]
    (seq,), = _decode(tok, model, [Request([ids], 1, False, 5, 10)], temperature=1.7, top_p=0.5)[0]
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([ids + seq.ids])).logits[0, :-1].float(), -1)
    want = logp[len(ids) - 1:].gather(-1, torch.tensor(seq.ids)[:, None]).squeeze(-1)
    assert seq.logprobs == pytest.approx(want.tolist(), abs=1e-4)


def test_top_p_equals_transformers_warper():
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0)) * 3
    for p in (0.1, 0.5, 0.95):
        assert torch.equal(_top_p(logits, p), TopPLogitsWarper(p)(None, logits))


def test_top_p_equals_the_warper_with_ties_and_masked_tokens(monkeypatch):
    """numpy's sort and a cut by value, or the warper's own sort where equal values straddle the
    cut: the warper's result to the bit either way, and the cut by value on untied rows."""
    from transformers.generation.logits_process import TopPLogitsWarper

    import leakray.models.decode as dec

    sorted_calls = []
    monkeypatch.setattr(dec, "_top_p_sorted", lambda x, p: sorted_calls.append(1) or _top_p_sorted(x, p))
    gen = torch.Generator().manual_seed(1)
    untied_sorted = 0
    for trial in range(600):
        rows, vocab = int(torch.randint(1, 40, (1,), generator=gen)), int(torch.randint(2, 500, (1,), generator=gen))
        x = torch.randn(rows, vocab, generator=gen) * float(torch.rand(1, generator=gen) * 6)
        if trial % 4 == 1:
            x = torch.round(x * 2) / 2  # many equal values
        if trial % 4 == 2:
            x[:, : vocab // 2] = -float("inf")  # banned tokens
        p, before = float(torch.rand(1, generator=gen)), len(sorted_calls)
        assert torch.equal(dec._top_p(x.clone(), p), TopPLogitsWarper(p)(None, x.clone())), trial
        untied_sorted += trial % 4 in (0, 3) and len(sorted_calls) > before
    assert sorted_calls and untied_sorted == 0  # the warper's way only where equal values meet at the cut
    # a tie across the cut: two tokens of 0.3 each, the cut between them -> the warper's way
    sorted_calls.clear()
    tie = torch.log(torch.tensor([[0.4, 0.3, 0.3]]))
    assert torch.equal(dec._top_p(tie, 0.5), TopPLogitsWarper(0.5)(None, tie.clone())) and sorted_calls == [1]


def test_chunks_group_prompts_of_similar_length_and_respect_the_cap():
    reqs = [Request([[0] * n], 2, False, 0, 8) for n in (10, 300, 12, 290, 11)]
    chunks = _chunks(reqs, max_sequences=4)
    assert sorted(i for c in chunks for i in c) == list(range(5))
    assert all(sum(reqs[i].n for i in c) <= 4 for c in chunks)
    assert {frozenset(c) for c in chunks} == {frozenset({0, 4}), frozenset({2}), frozenset({1, 3})}


def test_the_fused_gelu_is_the_same_function_and_gives_the_same_tokens(lm):
    import copy

    from leakray.models.kernels import fuse_gelu

    tok, model = lm
    fused = copy.deepcopy(model)
    assert fuse_gelu(fused) == model.config.n_layer  # one per block's MLP
    x = torch.linspace(-6, 6, 1001)
    act = model.transformer.h[0].mlp.act
    assert torch.allclose(fused.transformer.h[0].mlp.act(x), act(x), atol=1e-6)
    reqs = [Request([tok(p)["input_ids"]], 1, True, 0, 24) for p in PROMPTS]
    assert [[g.ids for g in r[0]] for r in _decode(tok, fused, reqs)] == \
        [[g.ids for g in r[0]] for r in _decode(tok, model, reqs)]


def test_a_chunk_enters_as_soon_as_the_pool_has_room_and_gives_the_tokens_it_gives_alone(lm, monkeypatch):
    """Pooled decoding: a later chunk joins the live sequences of an earlier one (never more
    than max_sequences at once), and each greedy request's tokens are the ones it gets alone."""
    tok, model = lm
    rows = []
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: rows.append(tuple(kw["input_ids"].shape)) or real(*a, **kw))
    budgets = [2, 20, 3, 18, 4, 16]  # one short and one long sequence per chunk of two
    reqs = [Request([tok(PROMPTS[i % 4])["input_ids"]], 1, True, 0, b) for i, b in enumerate(budgets)]
    pooled = _decode(tok, model, reqs, end_ids=set(), max_sequences=4)
    steps = [b for b, n in rows if n == 1]
    assert max(steps) <= 4 and max(steps) > 2  # chunks of two, and a joined chunk beside a live one
    assert len(steps) < sum(max(budgets[i:i + 2]) - 1 for i in range(0, 6, 2))  # fewer than chunk by chunk
    monkeypatch.setattr(model, "forward", real)
    for req, got in zip(reqs, pooled):
        (alone,), = _decode(tok, model, [req], end_ids=set())[0]
        assert got[0][0].ids == alone.ids and len(alone.ids) == req.max_new_tokens


def test_rows_leaving_fill_their_holes_from_the_end_and_the_cache_moves_just_those():
    from leakray.models.decode import _fill_holes, _growing_cache

    assert _fill_holes([0, 2, 3, 5], 6) == [0, 5, 2, 3]  # rows 1 and 4 end: 5 fills the hole at 1
    assert _fill_holes([0, 1, 2], 5) == [0, 1, 2]
    cache = _growing_cache(4)
    k = torch.randn(6, 2, 3, 4)
    v = torch.randn(6, 2, 3, 4)
    cache.update(k, v, 0)
    order = _fill_holes([0, 2, 3, 5], 6)
    cache.batch_select_indices(torch.tensor(order))
    layer = cache.layers[0]
    assert torch.equal(layer.keys, k[order]) and torch.equal(layer.values, v[order])
    cache.batch_select_indices(torch.tensor([0, 0, 1]))  # a gather (a prompt copied for its samples)
    assert torch.equal(layer.keys, k[order][[0, 0, 1]])


def test_ragged_attention_is_sdpa_over_each_rows_own_columns(lm):
    """A decoding step of left-padded prompts of different lengths: the same logits with
    attention split into runs of rows (leakray_sdpa) as with one SDPA call over the width."""
    import copy
    import inspect

    from leakray.models.ragged_attention import runs_of, use_ragged_attention

    assert runs_of([0, 0, 5, 5, 2]) == [(0, 2, 0), (2, 4, 5), (4, 5, 2)]
    assert runs_of([0, 3, 9], gap=4) == [(0, 2, 0), (2, 3, 9)]
    tok, model = lm
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")
    ragged = copy.deepcopy(model)
    ragged.set_attn_implementation("sdpa")
    assert use_ragged_attention(ragged) and ragged.config._attn_implementation == "leakray_sdpa"
    # elsewhere than the CPU it is slower than SDPA (an H200: 1.8-2x), so a sampler there keeps SDPA
    elsewhere = copy.deepcopy(plain).to("meta")  # a GPU's stand-in: any device but the CPU
    assert not use_ragged_attention(elsewhere) and elsewhere.config._attn_implementation == "sdpa"
    assert use_ragged_attention(elsewhere, any_device=True)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    nxt = torch.tensor([[5], [6], [7], [8]])
    step_mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    arg = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    logits = []
    with torch.inference_mode():
        for m in (plain, ragged):
            first = m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            out = m(input_ids=nxt, attention_mask=step_mask, position_ids=pos[:, -1:] + 1, use_cache=True,
                    **{arg: first.past_key_values})
            logits.append(out.logits[:, -1])
    assert torch.allclose(logits[0], logits[1], atol=1e-5)


HEAD = 'def count(items, key):\n    """Count the items whose key matches.\n\n    >>> count([1, 2], 1)\n    1\n    """\n'


def test_prompts_sharing_a_head_encode_it_once_and_decode_as_they_do_alone(lm, monkeypatch):
    """A request's variants sharing their first tokens with a base prompt (AdvPrompt's variants,
    a probe's nested cut points) encode those tokens once; every sequence's tokens are the ones
    it gets with each prompt encoded whole, its log-probs equal up to float rounding, beside a
    request with nothing shared and a sampled one in the same chunk."""
    import leakray.models.decode as D

    tok, model = lm
    ends = ["    return 0\n", "    n = 0\n    for x in items:\n", "    return len(items)\n"]
    variants = [tok(HEAD + e)["input_ids"] for e in ends]
    body = tok(HEAD + "    n = 0\n    for x in items:\n        n += 1\n")["input_ids"]
    cuts = [body[:c] for c in (len(body) - 9, len(body) - 5, len(body))]  # nested: the longest is the base
    assert D._shared_heads([Request(cuts, 1, True, 0, 4)], [0])[0][0] == 2
    reqs = [Request(variants, 1, True, 0, 12), Request([tok(PROMPTS[1])["input_ids"]], 1, True, 1, 12),
            # sampled, and one prompt sharing nothing: encoded apart from the others, drawn in its place
            Request(cuts, 1, True, 2, 12), Request(variants[:2] + [tok(PROMPTS[0])["input_ids"]], 2, False, 3, 12)]
    fed = []
    real = model.forward
    # the prompt and generated tokens each forward pass encodes (its new columns' mask)
    new_tokens = lambda kw: int(kw["attention_mask"][:, -kw["input_ids"].shape[1]:].sum())  # noqa: E731
    monkeypatch.setattr(model, "forward", lambda *a, **kw: fed.append(new_tokens(kw)) or real(*a, **kw))
    heads = D._shared_heads(reqs, range(len(reqs)))
    assert sorted(heads) == [0, 2, 3]  # not the single prompt
    saved = sum(sum(h) - max(h) for _, h in heads.values())  # each head encoded once, for its longest
    shared = _decode(tok, model, reqs, end_ids=set(), temperature=0.8, max_sequences=64)
    fed_shared, fed[:] = sum(fed), []
    (alone,) = _decode(tok, model, reqs[3:], end_ids=set(), temperature=0.8)  # the sampled one, alone
    assert [[g.ids for g in s] for s in alone] == [[g.ids for g in s] for s in shared[3]]
    fed[:] = []
    monkeypatch.setattr(D, "MIN_SHARED", 10 ** 9)  # every prompt encoded whole
    whole = _decode(tok, model, reqs, end_ids=set(), temperature=0.8, max_sequences=64)
    assert saved > 100 and sum(fed) - fed_shared == saved  # the same steps, fewer prompt tokens
    for a, b in zip(shared, whole):
        for sa, sb in zip(a, b):
            assert [g.ids for g in sa] == [g.ids for g in sb]
            for ga, gb in zip(sa, sb):
                assert ga.logprobs == pytest.approx(gb.logprobs, abs=1e-4)
