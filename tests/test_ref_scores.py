"""Per-token reference scores (Min-K%, Min-K%++, CodeMI inputs), the sampling knobs AdvPrompt
and BUZZER-b need (k, greedy, a task's variants batched), and the case perturbation."""

from __future__ import annotations

import ast
import gzip
import io
import json
import math
import re
import subprocess
import sys
import tokenize
import types
from collections import Counter
from types import SimpleNamespace as NS

import numpy as np
import pytest
from conftest import JAVAC_ONE_CORE, SHARED_BENCHMARKS, CharTokenizer
import torch

from leakray.data.tasks import continuation, generation_prompt, program_of
from leakray.models.backends import make_sampler
from leakray.models.sampler import RefScores, SampleConfig, reference_tokens
from leakray.perturb.case import uppercase_prompt
from leakray.schema import T

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
PROMPTS = [PROMPT, "def mul(a, b):\n", 'class Box:\n    """A box."""\n\n    def size(self):\n']
REFS = [PROMPT + "    return a + b\n", "def mul(a, b):\n    return a * b\n",
        'class Box:\n    """A box."""\n\n    def size(self):\n        return len(self.items) * 2 + 1\n']
JAVA_FILE = SHARED_BENCHMARKS / "humaneval_java.jsonl.gz"
needs_java_data = pytest.mark.skipif(not JAVA_FILE.exists(), reason="HumanEval-X Java file not on this machine")


@pytest.fixture(scope="module")
def hf(tiny_lm):
    return make_sampler(str(tiny_lm[0]), SampleConfig(k=3, max_new_tokens=16, temperature=1.3, seed=2))


# ---- reference scores, HF ------------------------------------------------------------------------

def _teacher_forced(sampler, prompt, ref):
    """log p over the vocabulary at each scored position, from a plain full forward pass."""
    ids, n_ctx = reference_tokens(sampler.tok, prompt, ref, sampler.max_positions, Counter())
    with torch.inference_mode():
        logits = sampler.model(torch.tensor([ids], device=sampler.device)).logits[0].double()
    logp = torch.log_softmax(logits, -1)[n_ctx - 1:-1].cpu().numpy()  # position t-1 predicts token t
    return logp, np.array(ids[n_ctx:])


def test_reference_scores_equal_a_direct_computation(hf):
    scores = hf.reference_scores(PROMPTS, REFS)
    assert len(scores) == 3
    for prompt, ref, s in zip(PROMPTS, REFS, scores):
        logp, target = _teacher_forced(hf, prompt, ref)
        n = len(target)
        assert n >= 3 and s.notes == []
        assert len(s.logprobs) == len(s.mu) == len(s.sigma) == len(s.rank) == n
        want = logp[np.arange(n), target]
        np.testing.assert_allclose(s.logprobs, want, rtol=0, atol=1e-4)
        assert -math.fsum(s.logprobs) / n == s.loss  # the loss IS the mean of the per-token NLL
        for t in sorted({0, n // 2, n - 1}):
            p = np.exp(logp[t])
            mu = float(np.sum(p * logp[t]))
            sigma = math.sqrt(float(np.sum(p * logp[t] ** 2)) - mu**2)
            assert s.mu[t] == pytest.approx(mu, abs=1e-4) and s.sigma[t] == pytest.approx(sigma, abs=1e-4)
            order = np.argsort(-logp[t], kind="stable")
            assert s.rank[t] == int(np.where(order == target[t])[0][0])
        # not trivially the token's own values: a distribution with spread, ranks not all 0
        assert all(sg > 0 for sg in s.sigma) and any(m != lp for m, lp in zip(s.mu, s.logprobs))
        # the prompt's own tokens, from the same pass: every context token but the first
        ids, n_ctx = reference_tokens(hf.tok, prompt, ref, hf.max_positions, Counter())
        with torch.inference_mode():
            logits = hf.model(torch.tensor([ids], device=hf.device)).logits[0].double()
            full = torch.log_softmax(logits, -1).cpu().numpy()
        want_ctx = sum(full[j - 1, ids[j]] for j in range(1, n_ctx))
        assert n_ctx >= 3 and s.context_logprob == pytest.approx(want_ctx, abs=1e-3) and s.context_logprob < 0
    assert any(r > 0 for s in scores for r in s.rank)
    # reference_loss keeps its meaning: the model's own loss on the continuation tokens
    ids, n_ctx = reference_tokens(hf.tok, PROMPTS[0], REFS[0], hf.max_positions, Counter())
    labels = torch.tensor([ids], device=hf.device)
    labels[:, :n_ctx] = -100
    with torch.inference_mode():
        model_loss = float(hf.model(input_ids=torch.tensor([ids], device=hf.device), labels=labels).loss)
    assert hf.reference_loss(PROMPTS, REFS) == [s.loss for s in scores]
    assert scores[0].loss == pytest.approx(model_loss, abs=1e-5)


def test_unscorable_references_say_why(tiny_lm):
    sampler = make_sampler(str(tiny_lm[0]), SampleConfig(max_new_tokens=8, max_model_len=40))
    long_ref = PROMPT + "    return a + b  # " + "words " * 60 + "\n"
    nothing, too_long, ok = sampler.reference_scores([PROMPT, PROMPT, PROMPT], [PROMPT, long_ref, REFS[0]])
    assert math.isnan(nothing.loss) and nothing.logprobs is nothing.mu is nothing.rank is None
    assert nothing.notes == ["ref_loss_no_continuation"]
    assert math.isfinite(ok.loss) and ok.notes == []
    # longer than the window: its head is scored after half a window of context, and counted
    ids, n_ctx = reference_tokens(sampler.tok, PROMPT, long_ref, sampler.max_positions, Counter())
    assert len(ids) == sampler.max_positions and n_ctx == sampler.max_positions // 2
    assert math.isfinite(too_long.loss) and len(too_long.logprobs) == len(too_long.rank) == len(ids) - n_ctx
    assert sampler.stats["ref_loss_no_continuation"] == 1 and sampler.stats["ref_loss_truncated_right"] == 1


# ---- sampling knobs, HF --------------------------------------------------------------------------

def _is_greedy(sampler, prompt, token_ids):
    """Every kept token is the model's argmax given the prompt and the tokens before it."""
    p_ids = sampler.tok(generation_prompt(prompt))["input_ids"]
    with torch.inference_mode():
        logits = sampler.model(torch.tensor([p_ids + token_ids], device=sampler.device)).logits[0]
    return logits[len(p_ids) - 1:-1].argmax(-1).tolist() == token_ids


def test_greedy_and_k_override(hf):
    prompts, langs = PROMPTS[:2], ["python"] * 2
    greedy = hf.sample(prompts, langs, ["a", "b"], greedy=True)
    assert [len(s.completions) for s in greedy] == [1, 1]
    for prompt, s in zip(prompts, greedy):
        assert _is_greedy(hf, prompt, s.token_ids[0])
    two = hf.sample(prompts[:1], langs[:1], ["z"], greedy=True, k=2)[0]  # greedy k copies
    assert two.completions == greedy[0].completions * 2
    sampled = hf.sample(prompts, langs, ["a", "b"], k=5)
    assert [len(s.completions) for s in sampled] == [5, 5]
    assert [len(s.completions) for s in hf.sample(prompts, langs, ["a", "b"])] == [3, 3]  # cfg.k
    assert not all(_is_greedy(hf, PROMPTS[0], ids) for ids in sampled[0].token_ids)
    with pytest.raises(ValueError, match="k must be"):
        hf.sample(prompts, langs, ["a", "b"], k=0)


def test_one_call_decodes_its_prompts_together_and_each_as_alone(hf, monkeypatch):
    """A call's prompts (a task's variants, and other tasks) share one prefill and one decoding
    loop; greedy results equal each prompt generated alone (to float tolerance of the padding:
    the same tokens here), and sampled ones depend on their task's key alone."""
    variants = [PROMPT, PROMPT.replace("Return", "Give back"), 'def add(a, b):\n    """Sum."""\n    c = 0\n']
    langs = ["python"] * 3
    alone = [hf.sample([v], ["python"], ["HumanEval/0"], greedy=True)[0] for v in variants]
    shapes = []
    real = hf.model.forward
    monkeypatch.setattr(hf.model, "forward", lambda *a, **kw: shapes.append(tuple(kw["input_ids"].shape)) or
                        real(*a, **kw))
    batched = hf.sample(variants, langs, ["HumanEval/0"] * 3, greedy=True)
    prefills = [s for s in shapes if s[1] > 1]
    assert len(prefills) == 1 and prefills[0][0] == 3  # one prefill, three rows, padded to one width
    for a, b in zip(alone, batched):
        assert b.completions == a.completions and b.token_ids == a.token_ids
        assert b.perplexity == pytest.approx(a.perplexity, rel=1e-4)
    shapes.clear()
    mixed = hf.sample(variants + [PROMPT], langs + ["python"], ["HumanEval/0"] * 3 + ["HumanEval/1"], greedy=True)
    assert len([s for s in shapes if s[1] > 1]) == 1 and mixed[3].completions == alone[0].completions
    # sampled: seeded by the task, whatever else shares the loop
    s1 = hf.sample(variants, langs, ["HumanEval/0"] * 3, k=2)
    s2 = hf.sample(variants + [PROMPT], langs + ["python"], ["HumanEval/0"] * 3 + ["HumanEval/7"], k=2)
    assert [s.token_ids for s in s1] == [s.token_ids for s in s2[:3]]
    assert all(len(s.completions) == 2 for s in s1)


# ---- vLLM, through a stand-in module --------------------------------------------------------------

_Tok = CharTokenizer  # conftest: one token per character, token 0 is EOS


class _LLM:
    """vllm.LLM's surface: `Logprob(logprob, rank)` objects, rank 1-based, in prompt_logprobs."""

    made: list[dict] = []

    def __init__(self, with_rank=True, **kwargs):
        _LLM.made.append(kwargs)
        self.with_rank, self.params = with_rank, []
        self.llm_engine = NS(model_config=NS(max_model_len=256))

    def get_tokenizer(self):
        return _Tok()

    def generate(self, prompts, params, use_tqdm=False):
        self.params.append(params)
        out = []
        for i, p in enumerate(prompts):
            ids = p["prompt_token_ids"]
            if getattr(params, "prompt_logprobs", None) == 0:
                entries = [None] + [{t: NS(logprob=-0.1 * (j % 4) - 0.05, rank=(j % 4) + 1 if self.with_rank else None)}
                                    for j, t in enumerate(ids[1:], 1)]
                out.append(NS(prompt_token_ids=ids, prompt_logprobs=entries))
            else:
                gen = [ord(c) for c in "\n    return 1\n"] + [0]
                comps = [NS(token_ids=gen, logprobs=[{t: NS(logprob=-0.5, rank=1)} for t in gen])
                         for _ in range(params[i].n)]
                out.append(NS(outputs=comps))
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM = _LLM
    mod.SamplingParams = lambda **kw: NS(**{"prompt_logprobs": None, **kw})
    monkeypatch.setitem(sys.modules, "vllm", mod)
    _LLM.made.clear()
    return mod


def test_vllm_reference_scores_from_prompt_logprobs(fake_vllm):
    from leakray.models.vllm_sampler import VLLMSampler

    s = VLLMSampler("m", SampleConfig(max_model_len=256))
    assert _LLM.made[0]["enable_prefix_caching"] is True and _LLM.made[0]["logprobs_mode"] == "raw_logprobs"
    ok, none = s.reference_scores(["ab", "ab"], ["abcdef", "ab"])
    # scored: c d e f at prompt positions 2..5; the stand-in gives rank (j % 4) + 1, 1-based
    assert ok.logprobs == pytest.approx([-0.1 * (j % 4) - 0.05 for j in range(2, 6)])
    assert ok.rank == [j % 4 for j in range(2, 6)] and ok.mu is None and ok.sigma is None
    assert ok.loss == -math.fsum(ok.logprobs) / 4 and ok.notes == ["ref_mu_sigma_unavailable"]
    # the prompt's tokens: position 1 only ("a" at 0 has no log-prob)
    assert ok.context_logprob == pytest.approx(-0.1 * 1 - 0.05) and math.isnan(none.context_logprob)
    assert math.isnan(none.loss) and none.notes == ["ref_loss_no_continuation"]
    assert s.reference_loss(["ab"], ["abcdef"]) == [ok.loss]
    s.llm.with_rank = False  # a version that reports no rank: None, said so
    (norank,) = s.reference_scores(["ab"], ["abcdef"])
    assert norank.rank is None and "ref_rank_unavailable" in norank.notes and norank.logprobs == ok.logprobs


def test_vllm_greedy_and_k(fake_vllm):
    from leakray.models.vllm_sampler import VLLMSampler

    s = VLLMSampler("m", SampleConfig(k=4, temperature=0.8, top_p=0.9, max_model_len=256))
    prompts = ['def f():\n    """x"""\n'] * 3
    out = s.sample(prompts, ["python"] * 3, ["t/0"] * 3, greedy=True)
    sent = s.llm.params[-1]
    assert [len(o.completions) for o in out] == [1, 1, 1] and len(s.llm.params) == 1  # one submission
    assert all(p.n == 1 and p.temperature == 0.0 and p.top_p == 1.0 for p in sent)
    s.sample(prompts[:1], ["python"], ["t/0"], k=2)
    assert s.llm.params[-1][0].n == 2 and s.llm.params[-1][0].temperature == 0.8
    s.sample(prompts[:1], ["python"], ["t/0"])
    assert s.llm.params[-1][0].n == 4


# ---- endpoint --------------------------------------------------------------------------------------

def test_endpoint_scores_are_logprobs_only(tiny_lm, hf):
    from leakray.models.endpoint_sampler import EndpointSampler
    from leakray.models.endpoint_server import CompletionServer, HFBackend

    cfg = SampleConfig(backend="openai", k=3, max_new_tokens=16)  # as `hf`
    with CompletionServer(HFBackend(str(tiny_lm[0]))) as srv:
        cfg.endpoint_url = srv.url
        sampler = EndpointSampler("tiny", cfg)
        got = sampler.reference_scores(PROMPTS[:2] + [PROMPT], REFS[:2] + [PROMPT])
        greedy = sampler.sample(PROMPTS[:1], ["python"], ["g/0"], greedy=True)[0]
        body = srv.requests[-1]
        sampler.close()
    want = hf.reference_scores(PROMPTS[:2], REFS[:2])
    for g, w in zip(got, want):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4) and g.loss == -math.fsum(g.logprobs) / len(g.logprobs)
        assert g.mu is g.sigma is g.rank is None
        assert g.context_logprob == pytest.approx(w.context_logprob, abs=1e-3)  # the echo's prompt tokens
        assert g.notes == ["ref_mu_sigma_unavailable", "ref_rank_unavailable"]
    assert math.isnan(got[2].loss) and got[2].notes == ["ref_loss_no_continuation"]
    assert sampler.loss_notes == [[], [], ["ref_loss_no_continuation"]]  # only NaN reasons, as before
    assert body["n"] == 1 and body["temperature"] == 0.0
    assert greedy.completions == hf.sample(PROMPTS[:1], ["python"], ["g/0"], greedy=True)[0].completions


def test_refscores_unscorable_shape():
    s = RefScores.unscorable(["x"])
    assert math.isnan(s.loss) and s.logprobs is None and s.notes == ["x"]


# ---- case perturbation (BUZZER-b) ------------------------------------------------------------------

def _strip_docstrings(tree: ast.AST) -> str:
    """The tree with every string-only statement (docstrings, prose) blanked: the code alone."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.value.value = ""
    return ast.dump(tree)


def _code_tokens(text: str) -> list[tuple[int, str]]:
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.COMMENT, tokenize.STRING)]


@pytest.fixture(scope="module")
def humaneval():
    from leakray.data.registry import load_benchmark

    return load_benchmark("humaneval", None)


def test_uppercase_keeps_every_humaneval_program_and_changes_its_prose(humaneval):
    assert len(humaneval) == 164
    changed = 0
    for task in humaneval:
        prompt = task[T.PROMPT]
        up = uppercase_prompt(prompt, "python")
        cont = continuation(prompt, task[T.REFERENCE])
        before, after = program_of(prompt, cont), program_of(up, cont)
        tree = ast.parse(after)  # raises on a broken program
        assert _strip_docstrings(tree) == _strip_docstrings(ast.parse(before)), task[T.TASK_ID]  # same code
        assert _code_tokens(after) == _code_tokens(before)
        assert up.count("\n") == prompt.count("\n")
        changed += up != prompt
        for line in prompt.splitlines():  # worked examples stay as they were
            if line.strip().startswith(">>>"):
                assert line in up.splitlines(), (task[T.TASK_ID], line)
    assert changed == 164
    first = uppercase_prompt(humaneval[0][T.PROMPT], "python")
    assert "CHECK IF IN GIVEN LIST OF NUMBERS" in first and "def has_close_elements(numbers: List[float]" in first


def test_uppercase_python_touches_only_docstrings_and_comments():
    src = ('"""Module doc."""\nimport os  # a comment\n\n'
           'def f(x):\n    """Line\\none \\x41 and \\N{bullet}."""\n    s = "keep me"\n    if x:\n'
           '        "not a docstring"\n    return "abc".join(s)\n    x = (\n        "in parens"\n    )\n\n'
           'class C:\n    r"""Raw \\d doc."""\n    def g(self):\n        f"""{x} f-string"""\n'
           '        "a" "b".upper()\n        "a" if x else "b"\n'
           'def h():\n    """Example:\n    >>> h()\n    \'abc\'\n\n    Back to prose."""\n')
    up = uppercase_prompt(src, "python")
    assert up.startswith('"""MODULE DOC."""\nimport os  # A COMMENT\n')
    assert '"""LINE\\nONE \\x41 AND \\N{BULLET}."""' in up  # escapes kept: \n stays a newline escape
    # a string statement alone does nothing when run: prose, changed; strings in expressions are not
    assert '"keep me"' in up and '"NOT A DOCSTRING"' in up and '"abc".join(s)' in up
    assert 'r"""RAW \\D DOC."""' in up and 'f"""{x} f-string"""' in up and '"a" "b".upper()' in up
    assert '"in parens"' in up and '"a" if x else "b"' in up
    assert "    >>> h()\n    'abc'\n\n    BACK TO PROSE." in up and '"""EXAMPLE:' in up
    assert ast.literal_eval(up.split("\n")[4].strip()) == "LINE\nONE A AND \u2022."


def test_uppercase_python_prompt_cut_mid_statement_keeps_what_it_can():
    src = 'def f(x):\n    """Doc."""\n    y = g(x,  # why\n'
    assert uppercase_prompt(src, "python") == 'def f(x):\n    """DOC."""\n    y = g(x,  # WHY\n'


def test_uppercase_refuses_unknown_language():
    from leakray.errors import BadInput

    with pytest.raises(BadInput, match="language"):
        uppercase_prompt("x", "rust")


def test_uppercase_java_comments_only():
    src = ('class A {\n    /** Javadoc {@code x}.\n     * >>> f(1)\n     * "ok"\n     */\n'
           '    int f(int x) { // trailing \\u0041 note\n        String s = "/* not a comment */";\n'
           '        /* block */ return x;\n    }\n}\n')
    up = uppercase_prompt(src, "java")
    assert "/** JAVADOC {@CODE X}.\n     * >>> f(1)\n     * \"ok\"\n     */" in up
    assert "// TRAILING \\u0041 NOTE" in up and '"/* not a comment */"' in up and "/* BLOCK */ return x;" in up


def _java_code_tokens(text: str) -> list[str]:
    from leakray.perturb.java_code import parser

    data = text.encode("utf8")
    out, stack = [], [parser().parse(data).root_node]
    while stack:
        node = stack.pop()
        if node.type in ("line_comment", "block_comment"):
            continue
        if node.child_count == 0:
            out.append(data[node.start_byte:node.end_byte].decode("utf8"))
        stack.extend(reversed(node.children))
    return out


@pytest.mark.slow
@needs_java_data
def test_uppercase_java_humaneval_x_compiles(tmp_path):
    """All 164 upper-cased prompts + reference, with their tests, in ONE javac call."""
    from leakray.sandbox.java import java_files

    rows = [json.loads(line) for line in gzip.open(JAVA_FILE, "rt")]
    assert len(rows) == 164
    files, labels, changed = [], {}, 0
    for k, row in enumerate(rows):
        up = uppercase_prompt(row["prompt"], "java")
        changed += up != row["prompt"]
        program = up + row["canonical_solution"]
        assert _java_code_tokens(program) == _java_code_tokens(row["prompt"] + row["canonical_solution"])
        pkg = tmp_path / f"p{k}"
        pkg.mkdir()
        labels[f"p{k}"] = row["task_id"]
        for name, text in java_files(program, row["test"]).items():
            (pkg / name).write_text(f"package p{k};\n{text}", encoding="utf-8")
            files.append(str(pkg / name))
    assert changed == 164
    (tmp_path / "sources.txt").write_text("\n".join(files))
    proc = subprocess.run(["javac", *JAVAC_ONE_CORE, "-proc:none", "-nowarn", "-encoding", "UTF-8", "-d",
                           str(tmp_path / "out"), f"@{tmp_path / 'sources.txt'}"], capture_output=True, text=True)
    errors = {labels[m.group(1)] for m in re.finditer(r"/(p\d+)/\w+\.java:\d+: error", proc.stderr)}
    assert proc.returncode == 0, (sorted(errors)[:10], proc.stderr[-1500:])
