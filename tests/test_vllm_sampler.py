"""vLLM sampler with LoRA adapters over one base engine, through a stand-in `vllm` module
(no GPU here; scripts/gpu_check.py is the end-to-end check on one)."""

import json
import math
import sys
import types
from types import SimpleNamespace as NS

import pytest
from conftest import CharTokenizer

from leakray.errors import BadInput
from leakray.models.sampler import SampleConfig

PY_PROMPT = 'def f():\n    """One."""\n'


_Tok = CharTokenizer  # conftest: one token per character, token 0 is EOS


class _LoRARequest:
    """vllm.lora.request.LoRARequest's positional surface: (lora_name, lora_int_id, lora_path)."""

    def __init__(self, lora_name, lora_int_id, lora_path):
        if lora_int_id < 1:
            raise ValueError("lora_int_id must be > 0")  # as vLLM
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class _LLM:
    """vllm.LLM: records its engine arguments and, per generate call, the LoRA request of each prompt."""

    made: list[dict] = []

    def __init__(self, **kwargs):
        _LLM.made.append(kwargs)
        self.calls = []  # (n prompts, lora_request as passed)
        self.llm_engine = NS(model_config=NS(max_model_len=256))

    def get_tokenizer(self):
        return _Tok()

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        self.calls.append((len(prompts), lora_request))
        out = []
        for i, p in enumerate(prompts):
            ids = p["prompt_token_ids"]
            req = lora_request[i] if isinstance(lora_request, list) else lora_request
            lp = -0.5 if req is None else -0.1 * req.lora_int_id  # each adapter its own distribution
            if getattr(params, "prompt_logprobs", None) == 0:
                out.append(NS(prompt_token_ids=ids,
                              prompt_logprobs=[None] + [{t: NS(logprob=lp, rank=1)} for t in ids[1:]]))
            else:
                gen = ([ord(c) for c in "\n    return 1\n"] + [0])[:max(params[i].max_tokens, 1)]
                comps = [NS(token_ids=gen, text="".join(chr(t) for t in gen if t),
                            logprobs=[{t: NS(logprob=lp, rank=1)} for t in gen])
                         for _ in range(params[i].n)]
                out.append(NS(outputs=comps))
        return out


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    mod = types.ModuleType("vllm")
    mod.LLM = _LLM
    mod.SamplingParams = lambda **kw: NS(**{"prompt_logprobs": None, **kw})
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = _LoRARequest
    for name, m in (("vllm", mod), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "cache"))
    _LLM.made.clear()
    return mod


def _adapter(path, r):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": r, "peft_type": "LORA"}))
    return str(path)


@pytest.fixture
def two_adapters(tmp_path):
    return {"target": _adapter(tmp_path / "target", 4), "shadow": _adapter(tmp_path / "shadow", 16)}


def test_adapters_share_one_unmerged_engine(fake_vllm, two_adapters, tmp_path, monkeypatch):
    import leakray.models.vllm_sampler as vs

    monkeypatch.setattr(vs, "merge_adapter", lambda *a, **k: pytest.fail("an adapter was merged"))
    base = vs.VLLMSampler("base-dir", SampleConfig(k=3, max_model_len=256), adapters=two_adapters,
                          engine_args={"enforce_eager": True})
    (made,) = _LLM.made  # one engine for both adapters
    assert made["model"] == "base-dir" and made["enable_lora"] is True
    assert made["max_lora_rank"] == 16 and made["max_loras"] == 2  # ranks 4 and 16 -> 16
    assert made["enforce_eager"] is True and made["logprobs_mode"] == "raw_logprobs"
    assert base.adapters == {"target": 1, "shadow": 2}
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())

    target, shadow = base.using("target"), base.using("shadow")
    assert target.llm is shadow.llm is base.llm
    prompts = [PY_PROMPT, PY_PROMPT + "# b\n", PY_PROMPT + "# c\n"]
    t_out = target.sample(prompts, ["python"] * 3, ["t/0", "t/1", "t/2"])
    s_out = shadow.sample(prompts[:2], ["python"] * 2, ["t/0", "t/1"])
    b_out = base.sample(prompts[:1], ["python"], ["t/0"])
    t_refs = target.reference_scores(prompts[:2], [PY_PROMPT + "    return 1\n"] * 2)
    calls = base.llm.calls
    # every prompt of every call carries its sampler's adapter; the base carries none
    (n0, r0), (n1, r1), (n2, r2), (n3, r3) = calls
    assert n0 == len(r0) == 3 and n1 == len(r1) == 2 and r2 is None and n3 == len(r3) == 2
    assert {(r.lora_name, r.lora_int_id, r.lora_path) for r in r0 + r3} == {
        ("target", 1, str((tmp_path / "target").resolve()))}
    assert {(r.lora_name, r.lora_int_id) for r in r1} == {("shadow", 2)}
    # the stand-in gives each adapter its own log-probs: the results are the adapter's
    assert t_out[0].perplexity[0] == pytest.approx(math.exp(0.1))
    assert s_out[0].perplexity[0] == pytest.approx(math.exp(0.2))
    assert b_out[0].perplexity[0] == pytest.approx(math.exp(0.5))
    assert t_refs[0].logprobs and t_refs[0].logprobs == pytest.approx([-0.1] * len(t_refs[0].logprobs))
    assert len(t_out[0].completions) == 3


def test_adapter_ids_are_stable_per_name(fake_vllm, two_adapters):
    from leakray.models.vllm_sampler import VLLMSampler

    base = VLLMSampler("base", SampleConfig(k=1, max_model_len=256), adapters=two_adapters)
    seen = []
    for name in ["shadow", "target", "shadow", "target", "target"]:
        view = base.using(name)
        view.sample([PY_PROMPT], ["python"], ["t/0"])
        view.reference_scores([PY_PROMPT], [PY_PROMPT + "    return 1\n"])
        seen += [(name, r.lora_int_id) for _, reqs in base.llm.calls[-2:] for r in reqs]
    assert set(seen) == {("shadow", 2), ("target", 1)}
    # a view's counters are its own, the engine is shared
    t = base.using("target")
    t.reference_scores([PY_PROMPT], [PY_PROMPT])
    assert t.stats["ref_loss_no_continuation"] == 1 and base.stats["ref_loss_no_continuation"] == 0


def test_default_adapter_and_config_adapter(fake_vllm, two_adapters):
    from leakray.models.vllm_sampler import CONFIG_ADAPTER, VLLMSampler

    s = VLLMSampler("base", SampleConfig(k=1, max_model_len=256), adapters=two_adapters, adapter="shadow")
    s.sample([PY_PROMPT], ["python"], ["t/0"])
    assert s.llm.calls[-1][1][0].lora_name == "shadow"
    assert s.using(None).sample([PY_PROMPT], ["python"], ["t/0"]) and s.llm.calls[-1][1] is None

    cfg = SampleConfig(k=1, max_model_len=256)
    cfg.lora_adapter = two_adapters["target"]  # SampleConfig.lora_adapter where the config has the field
    c = VLLMSampler("base", cfg)
    assert _LLM.made[-1]["enable_lora"] is True and _LLM.made[-1]["max_lora_rank"] == 8
    c.sample([PY_PROMPT], ["python"], ["t/0"])
    assert c.adapter == CONFIG_ADAPTER and c.llm.calls[-1][1][0].lora_path.endswith("target")


def test_no_adapter_leaves_lora_off(fake_vllm):
    from leakray.models.vllm_sampler import VLLMSampler

    s = VLLMSampler("base", SampleConfig(k=1, max_model_len=256))
    assert "enable_lora" not in _LLM.made[-1] and s.adapters == {}
    s.sample([PY_PROMPT], ["python"], ["t/0"])
    assert s.llm.calls[-1][1] is None


def test_bad_adapters_refused(fake_vllm, two_adapters, tmp_path):
    from leakray.models.vllm_sampler import VLLMSampler, engine_lora_rank

    with pytest.raises(BadInput, match="not among the registered"):
        VLLMSampler("base", SampleConfig(max_model_len=256), adapters=two_adapters, adapter="other")
    with pytest.raises(BadInput, match="not among the registered"):
        VLLMSampler("base", SampleConfig(max_model_len=256), adapters=two_adapters).using("other")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match=r"empty/adapter_config.json.*not a peft LoRA"):
        VLLMSampler("base", SampleConfig(max_model_len=256), adapters={"x": str(tmp_path / "empty")})
    assert engine_lora_rank([1]) == 8 and engine_lora_rank([8, 9]) == 16 and engine_lora_rank([300]) == 320
    with pytest.raises(BadInput, match="exceeds"):
        engine_lora_rank([1024])


def test_merge_adapters_serves_a_merged_copy(fake_vllm, tiny_lm, tmp_path):
    """The `merge_adapters` option: base + adapter merged by peft, loaded as a plain model, cached."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from leakray.models.vllm_sampler import VLLMSampler

    path, _ = tiny_lm
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "ad")
    cfg = SampleConfig(k=1, max_model_len=256)
    cfg.lora_adapter, cfg.merge_adapters = str(tmp_path / "ad"), True
    s = VLLMSampler(str(path), cfg)
    merged_dir = _LLM.made[-1]["model"]
    assert "enable_lora" not in _LLM.made[-1] and s.adapter is None and "merged-" in merged_dir
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path / "ad")(ids).logits
        base = AutoModelForCausalLM.from_pretrained(path)(ids).logits
        got = AutoModelForCausalLM.from_pretrained(merged_dir)(ids).logits
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, base, atol=1e-3)
    VLLMSampler(str(path), cfg)
    assert _LLM.made[-1]["model"] == merged_dir  # cached: merged once
