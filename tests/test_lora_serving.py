"""LoRA fine-tunes served unmerged: finetune saves the peft adapter beside the merged model, and
the protocols' collections sample vLLM's base engine with the role's adapter (a LoRARequest per
prompt, generation and the prompt_logprobs pass alike) unless `merge_adapters`. vLLM itself is a
stand-in here (no GPU); scripts/gpu_check.py checks the real engine on one."""

import importlib.machinery
import json
from pathlib import Path
import sys
import types
from types import SimpleNamespace as NS

import pytest
from conftest import CharTokenizer

from leakray.models.finetune import FinetuneConfig, finetune
from leakray.models.sampler import SampleConfig

STAND_IN = Path(__file__).resolve().parent / "fixtures" / "model_dir_stand_in"  # config.json + tokenizer, no weights
from leakray.models.vllm_sampler import sampling_source
from leakray.schema import C, T

PROMPT = 'def add(a, b):\n    """Add two numbers."""\n'
REF = PROMPT + "    return a + b\n"


# ---- finetune saves the adapter ----------------------------------------------------------------

def test_lora_finetune_saves_an_adapter_equal_to_the_merged_model(tiny_lm, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, _ = tiny_lm
    out = tmp_path / "lora"
    stats = finetune(path, [REF], FinetuneConfig(method="lora", epochs=2, lr=2e-2, lora_r=4), out, progress=False)
    adapter = out / "adapter"
    assert stats["adapter"] == str(adapter)
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    assert list(adapter.glob("adapter_model.*"))
    merged = AutoModelForCausalLM.from_pretrained(out)  # the merged model is still the model dir
    assert not any("lora" in name for name, _ in merged.named_parameters())
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.inference_mode():
        served = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), str(adapter)).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(path)(ids).logits
        got = merged.eval()(ids).logits
    assert torch.allclose(served, got, atol=1e-4)
    assert not torch.allclose(got, base, atol=1e-3)  # the adapter learned something: the check can fail


def test_full_finetune_saves_no_adapter(tiny_lm, tmp_path):
    path, _ = tiny_lm
    stats = finetune(path, [REF], FinetuneConfig(method="full", epochs=1), tmp_path / "full", progress=False)
    assert "adapter" not in stats and not (tmp_path / "full" / "adapter").exists()
    assert (tmp_path / "full" / "config.json").exists()


# ---- which model a collection samples ----------------------------------------------------------

LORA_INFO = {"config": {"method": "lora"}, "adapter": "/run/target/model/adapter"}
FULL_INFO = {"config": {"method": "full"}}


@pytest.mark.parametrize("sample, info, want", [
    (SampleConfig(backend="hf"), LORA_INFO, ("/merged", None)),
    (SampleConfig(backend="vllm"), LORA_INFO, ("/base", "/run/target/model/adapter")),
    (SampleConfig(backend="vllm", merge_adapters=True), LORA_INFO, ("/merged", None)),
    (SampleConfig(backend="vllm"), FULL_INFO, ("/merged", None)),
    (SampleConfig(backend="vllm"), {"config": {"method": "lora"}}, ("/merged", None)),  # a run from before adapters
    (SampleConfig(backend="vllm"), {}, ("/merged", None)),  # no fine-tune stage (a given target)
    (SampleConfig(backend="vllm", lora_adapter="/mine"), FULL_INFO, ("/merged", "/mine")),  # the config's own
])
def test_sampling_source(sample, info, want):
    assert sampling_source("/merged", info, "/base", sample) == want


# ---- the protocols send the adapter through the vLLM stand-in --------------------------------------

class _LoRARequest:
    def __init__(self, lora_name, lora_int_id, lora_path):
        assert lora_int_id >= 1  # as vLLM
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class _StrictLLM:
    """vllm.LLM that refuses any generate call without one LoRARequest per prompt."""

    made: list = []

    def __init__(self, **kwargs):
        _StrictLLM.made.append(self)
        self.kwargs, self.calls, self.refused = kwargs, [], 0  # calls: (prompt_logprobs pass?, [lora paths])
        self.llm_engine = NS(model_config=NS(max_model_len=256))

    def get_tokenizer(self):
        return CharTokenizer()

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        # counted as well as raised: SampleStage turns a row's exception into a failed row
        self.refused += not (isinstance(lora_request, list) and len(lora_request) == len(prompts))
        assert isinstance(lora_request, list) and len(lora_request) == len(prompts), \
            f"generate without a LoRARequest per prompt: {lora_request!r}"
        scoring = getattr(params, "prompt_logprobs", None) == 0
        self.calls.append((scoring, [r.lora_path for r in lora_request]))
        out = []
        for i, p in enumerate(prompts):
            ids = p["prompt_token_ids"]
            if scoring:
                out.append(NS(prompt_logprobs=[None] + [{t: NS(logprob=-0.1, rank=1)} for t in ids[1:]]))
            else:
                gen = [ord(c) for c in "    return a + b\n"] + [0]
                out.append(NS(outputs=[NS(token_ids=gen, logprobs=[{t: NS(logprob=-0.1, rank=1)} for t in gen])
                                       for _ in range(params[i].n)]))
        return out


@pytest.fixture
def strict_vllm(monkeypatch, tmp_path):
    mod = types.ModuleType("vllm")
    mod.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # config's find_spec("vllm") sees it
    mod.LLM = _StrictLLM
    mod.SamplingParams = lambda **kw: NS(**{"prompt_logprobs": None, **kw})
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = _LoRARequest
    for name, m in (("vllm", mod), ("vllm.lora", types.ModuleType("vllm.lora")), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.setenv("LEAKRAY_CACHE", str(tmp_path / "cache"))
    _StrictLLM.made.clear()


def _adapter(path, r=4):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": r, "peft_type": "LORA"}))
    return str(path)


def _tasks(n=4):
    return [{T.TASK_ID: f"t/{i}", T.BENCHMARK: "toy", T.LANGUAGE: "python", T.PROMPT: PROMPT, T.REFERENCE: REF,
             T.TESTS: "", T.RUNNER: "python"} for i in range(n)]


def _runner(tmp_path, info):
    from leakray.runs import StageRunner

    runner = StageRunner(tmp_path / "run", console=None)
    runner.info.update(info)
    return runner


def _capture(monkeypatch):
    from leakray.protocols import collection

    seen = []
    monkeypatch.setattr(collection, "collect_to", lambda table, path, ccfg, out: seen.append((table, path, ccfg)) or {})
    return seen


def _sample_through_stage(table, path, ccfg):
    """SampleStage as collect_steps builds it (model path and the typed configs), on the stand-in."""
    import pyarrow as pa

    from leakray.stages.sample import SampleStage

    stage = SampleStage(path, ccfg.sample, ccfg.extra)
    out = stage(pa.Table.from_pylist(table.to_pylist()[:2], schema=table.schema))
    return stage, out


def _simulate_cfg(**sample):
    from leakray.config import SimulateConfig

    # a non-GPT-2 base (vLLM serves no LoRA over GPT-2): a directory shaped like a model (config and
    # tokenizer files) passes the config's check; the stand-in engines never load it
    return SimulateConfig.model_validate({
        "model": {"base": str(STAND_IN)},
        "sample": {"backend": "vllm", "k": 2, "max_model_len": 256, **sample},
        "target": {"method": "lora"}, "shadow": {"method": "lora"},
        "columns": {"advprompt": False, "upper_case": True, "reference_model": None},
        "execute": {"allow_weak_isolation": True}})


@pytest.mark.parametrize("role", ["target", "shadow"])
def test_simulate_collects_base_engine_with_the_roles_adapter(strict_vllm, tmp_path, monkeypatch, role):
    from leakray.protocols.simulate import simulate_stages

    tasks = _tasks()
    adapter = _adapter(tmp_path / "run" / role / "model" / "adapter")
    runner = _runner(tmp_path, {"base": {"path": "/models/base"},
                                role: {"config": {"method": "lora"}, "adapter": adapter}})
    (tmp_path / "run" / "folds").mkdir(parents=True)
    (tmp_path / "run" / "folds" / "folds.json").write_text(json.dumps({t[T.TASK_ID]: i for i, t in enumerate(tasks)}))
    seen = _capture(monkeypatch)
    (spec,) = [s for s in simulate_stages(_simulate_cfg(), tasks, runner, "bwrap") if s.name == f"collect_{role}"]
    spec.run(tmp_path / "out")
    ((table, path, ccfg),) = seen
    assert path == "/models/base" and ccfg.sample.lora_adapter == adapter

    stage, out = _sample_through_stage(table, path, ccfg)
    (llm,) = _StrictLLM.made  # one engine: the base, LoRA on
    assert llm.refused == 0 and not any("failed:" in n for row in out.column(C.NOTES).to_pylist() for n in row)
    assert llm.kwargs["model"] == "/models/base" and llm.kwargs["enable_lora"] is True
    passes = {scoring for scoring, _ in llm.calls}
    assert passes == {True, False}  # generation and the reference's prompt_logprobs pass
    assert {p for _, paths in llm.calls for p in paths} == {str((tmp_path / "run" / role / "model" / "adapter")
                                                                 .resolve())}
    assert out.column(C.REF_TOKEN_LOGPROBS).to_pylist()[0][0] == pytest.approx(-0.1)
    assert out.column(C.COMPLETIONS).to_pylist()[0] == ["    return a + b\n"] * 2


def test_simulate_merge_adapters_samples_the_merged_model(strict_vllm, tmp_path, monkeypatch):
    from leakray.protocols.simulate import simulate_stages

    tasks = _tasks()
    runner = _runner(tmp_path, {"base": {"path": "/models/base"},
                                "target": {"config": {"method": "lora"}, "adapter": "/x/adapter"}})
    (tmp_path / "run" / "folds").mkdir(parents=True)
    (tmp_path / "run" / "folds" / "folds.json").write_text(json.dumps({t[T.TASK_ID]: i for i, t in enumerate(tasks)}))
    seen = _capture(monkeypatch)
    (spec,) = [s for s in simulate_stages(_simulate_cfg(merge_adapters=True), tasks, runner, "bwrap")
               if s.name == "collect_target"]
    spec.run(tmp_path / "out")
    ((_, path, ccfg),) = seen
    assert path == str(tmp_path / "run" / "target" / "model") and ccfg.sample.lora_adapter is None


def test_audit_collects_shadow_and_planted_target_with_their_adapters(strict_vllm, tmp_path, monkeypatch):
    from leakray.config import AuditConfig
    from leakray.protocols.audit import audit_stages

    tasks = _tasks()
    shadow, target = (_adapter(tmp_path / "run" / r / "model" / "adapter") for r in ("shadow", "target"))
    runner = _runner(tmp_path, {
        "base": {"path": "/models/base"},
        "shadow": {"model": str(tmp_path / "run/shadow/model"), "config": {"method": "lora"}, "adapter": shadow},
        "target": {"model": str(tmp_path / "run/target/model"), "config": {"method": "lora"}, "adapter": target}})
    (tmp_path / "run" / "split").mkdir(parents=True)
    (tmp_path / "run" / "split" / "split.json").write_text(json.dumps(
        {"shadow_members": ["t/0", "t/1"], "planted_members": ["t/2"]}))
    cfg = AuditConfig.model_validate({**_simulate_cfg().model_dump(), "audit": {"target": "planted"}})
    seen = _capture(monkeypatch)
    for spec in audit_stages(cfg, tasks, runner, "bwrap", None):
        if spec.name.startswith("collect_"):
            spec.run(tmp_path / spec.name)
    assert [(path, ccfg.sample.lora_adapter) for _, path, ccfg in seen] == [
        ("/models/base", shadow), ("/models/base", target)]
    # the shadow's collection through SampleStage: every pass carries the shadow's adapter
    _, out = _sample_through_stage(*seen[0])
    assert _StrictLLM.made[0].refused == 0 and out.column(C.REF_TOKEN_LOGPROBS).to_pylist()[0]
    assert {p for _, paths in _StrictLLM.made[0].calls for p in paths} == {str((tmp_path / "run/shadow/model/adapter")
                                                                               .resolve())}


def test_strict_stand_in_refuses_a_base_only_engine(strict_vllm):
    """The stand-in fails a pipeline that forgot the adapter (so the tests above can fail)."""
    from leakray.models.vllm_sampler import VLLMSampler

    s = VLLMSampler("/models/base", SampleConfig(backend="vllm", k=1, max_model_len=256))
    with pytest.raises(AssertionError, match="without a LoRARequest"):
        s.sample([PROMPT], ["python"], ["t/0"])


def test_gpt2_base_with_an_adapter_asks_for_merge_adapters(strict_vllm, tiny_lm, tmp_path):
    """vLLM has no LoRA for GPT-2 (the tiny base): refused before an engine starts, merging works."""
    from leakray.errors import BadInput
    from leakray.models.vllm_sampler import VLLMSampler

    path, _ = tiny_lm
    cfg = SampleConfig(backend="vllm", k=1, max_model_len=256, lora_adapter=_adapter(tmp_path / "ad"))
    with pytest.raises(BadInput, match=r"config.json.*no LoRA support for 'gpt2'.*merge_adapters=true"):
        VLLMSampler(str(path), cfg)
    assert _StrictLLM.made == []


def test_vllm_lora_over_the_tiny_gpt2_base_is_refused_by_the_config(monkeypatch):
    import leakray.config as config

    monkeypatch.setattr(config, "_need_modules", lambda *a: None)  # vllm itself is not installed on CPU
    with pytest.raises(ValueError, match="merge_adapters=true"):
        config.SimulateConfig(sample={"backend": "vllm"}, shadow={"method": "lora"})
    ok = config.SimulateConfig(sample={"backend": "vllm", "merge_adapters": True}, shadow={"method": "lora"})
    assert ok.sample.merge_adapters
    assert config.SimulateConfig(sample={"backend": "vllm"}, model={"base": str(STAND_IN)},
                                 shadow={"method": "lora"}).shadow.method == "lora"
