import math

import pytest
import torch

from leakray.models.finetune import FinetuneConfig, finetune, lora_targets
from leakray.data.tasks import continuation, generation_prompt, program_of
from leakray.models.sampler import SampleConfig, make_sampler
from leakray.models.stops import truncate

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'


def test_python_stops_end_the_function():
    raw = "    return a + b\n\ndef other():\n    pass\n"
    assert truncate(PROMPT, raw, "python") == "    return a + b\n"
    assert truncate(PROMPT, "    x = 1\n#comment\n", "python") == "    x = 1\n"
    assert truncate(PROMPT, "    return 1\nif __name__ == '__main__':\n    exit(0)\n", "python") == "    return 1\n"


def test_java_stop_closes_the_class_ignoring_braces_in_strings():
    prompt = "class Solution {\n    public int f() {\n"
    raw = '        String s = "}}";\n        return 1;\n    }\n}\nclass Extra {}\n'
    out = truncate(prompt, raw, "java")
    assert out.endswith("    }\n}\n") and "Extra" not in out and '"}}"' in out


def test_continuation_and_program_meet_at_the_generation_prompt():
    assert continuation("ab", "abc") == "c" and continuation("x", "abc") == "abc"
    assert generation_prompt(PROMPT) == PROMPT.rstrip()
    ref = PROMPT + "    return a + b\n"
    assert continuation(PROMPT, ref) == "\n    return a + b\n"
    assert program_of(PROMPT, continuation(PROMPT, ref)) == ref


def test_sampler_perplexity_is_of_the_unwarped_model(tiny_lm):
    """Sampling is warped (temperature, top-p), the perplexity must not be: recompute it
    by teacher forcing the generated tokens and compare."""
    path, _ = tiny_lm
    cfg = SampleConfig(k=3, temperature=1.7, top_p=0.5, max_new_tokens=12, batch_size=2, seed=0)
    sampler = make_sampler(str(path), cfg)
    prompts = [PROMPT, "def mul(a, b):\n"]
    out = sampler.sample(prompts, ["python", "python"], ["t0", "t1"])
    assert len(out) == 2 and all(len(s.completions) == 3 for s in out)
    tok, model = sampler.tok, sampler.model
    checked = 0
    for prompt, samples in zip(prompts, out):
        for ppl, c_ids in zip(samples.perplexity, samples.token_ids):
            assert math.isfinite(ppl) and ppl > 0
            p_ids = tok(generation_prompt(prompt))["input_ids"]
            ids = torch.tensor([p_ids + c_ids])
            with torch.inference_mode():
                logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            lp = logp[len(p_ids) - 1:].gather(-1, ids[0, len(p_ids):, None]).squeeze(-1)
            assert math.exp(-lp.mean().item()) == pytest.approx(ppl, rel=1e-3)
            checked += 1
    assert checked >= 1
    # a retried batch (same keys) gives the same completions
    again = sampler.sample(prompts, ["python", "python"], ["t0", "t1"])
    assert [s.completions for s in again] == [s.completions for s in out]


def test_reference_loss_drops_after_finetuning_on_it(tiny_lm, tmp_path):
    path, _ = tiny_lm
    ref = PROMPT + "    return a + b\n"
    before = make_sampler(str(path), SampleConfig()).reference_loss([PROMPT], [ref])[0]
    stats = finetune(path, [ref], FinetuneConfig(method="full", epochs=8, lr=3e-3, seed=0), tmp_path / "ft",
                     progress=False)
    after = make_sampler(str(tmp_path / "ft"), SampleConfig()).reference_loss([PROMPT], [ref])[0]
    assert stats["loss_per_epoch"][-1] < stats["loss_per_epoch"][0]
    assert after < before - 0.5


def test_lora_trains_a_fraction_and_saves_a_merged_model(tiny_lm, tmp_path):
    from transformers import AutoModelForCausalLM

    path, _ = tiny_lm
    model = AutoModelForCausalLM.from_pretrained(path)
    assert set(lora_targets(model)) >= {"c_attn", "c_fc"}
    stats = finetune(path, [PROMPT + "    return a + b\n"], FinetuneConfig(method="lora", epochs=2, lr=1e-3),
                     tmp_path / "lora", progress=False)
    assert 0 < stats["trainable_parameters"] < stats["parameters"] / 2
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "lora")
    assert not any("lora" in name for name, _ in merged.named_parameters())


def test_bad_method_refused():
    with pytest.raises(ValueError, match="full.*lora"):
        FinetuneConfig(method="qlora")


class _FakeTok:
    """Character-level stand-in: one token per character."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}


class _FakeLLM:
    """Answers like vllm.LLM.generate: per-token {token_id: logprob} dicts."""

    def __init__(self, completions):
        self.completions, self.seen = completions, []

    def get_tokenizer(self):
        return _FakeTok()

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace as NS

        self.seen.append(params)
        out = []
        for p in prompts:
            if isinstance(params, dict) and params.get("prompt_logprobs") == 0:
                ids = [ord(c) for c in p]
                out.append(NS(prompt_token_ids=ids, prompt_logprobs=[None] + [{t: -1.0} for t in ids[1:]]))
                continue
            comps = [NS(text=t, token_ids=[ord(c) for c in t], logprobs=[{ord(c): -0.5} for c in t])
                     for t in self.completions]
            out.append(NS(outputs=comps))
        return out


def test_vllm_sampler_request_handling_without_a_gpu(monkeypatch):
    from leakray.models.vllm_sampler import VLLMSampler

    monkeypatch.setattr(VLLMSampler, "_params", lambda self, **kw: kw)
    llm = _FakeLLM(["  return 1;\n }\n}\nclass X {}\n", "  return 2;\n"])
    s = VLLMSampler("m", SampleConfig(k=2, seed=5), llm=llm)
    prompt = "class A {\n public int f() {\n"
    (out,) = s.sample([prompt], ["java"], ["Java/0"])
    assert out.completions[0] == "  return 1;\n }\n}\n" and "class X" not in out.completions[0]
    assert out.n_tokens[0] == len("  return 1;\n }\n}") and out.perplexity[0] == pytest.approx(math.exp(0.5))
    assert llm.seen[0][0]["n"] == 2 and llm.seen[0][0]["logprobs"] == 0
    again = VLLMSampler("m", SampleConfig(k=2, seed=5), llm=_FakeLLM(["x"]))
    again.sample([prompt], ["java"], ["Java/0"])
    assert again.llm.seen[0][0]["seed"] == llm.seen[0][0]["seed"]  # per-task seed
    (loss,) = s.reference_loss(["ab"], ["abcd"])
    assert loss == pytest.approx(1.0)


def test_missing_vllm_names_the_extra(monkeypatch):
    import builtins

    from leakray.models.vllm_sampler import VLLMSampler

    real = builtins.__import__

    def fake_import(name, *a, **kw):
        if name == "vllm":
            raise ImportError("no vllm")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"pip install 'leakray\[vllm\]'"):
        VLLMSampler("m", SampleConfig())
