"""scripts/gpu_check.py: its CPU parts run on any host (a GPU, if present, hidden from them);
its vLLM checks are exercised with the HF sampler standing in for vLLM (the true model
passes, the wrong adapter fails), and run for real only where vLLM can run."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"
CUDA_SCRIPT = ROOT / "scripts" / "cuda_check.py"
CPU_CHECKS = ["build_base", "build_adapters", "merge_matches_peft", "adapters_differ", "hf_teacher_forcing",
              "hf_reference_scores"]
VLLM_CHECKS = ["vllm_engine", "vllm_sample", "vllm_vs_hf_ppl", "vllm_adapter_applied", "vllm_prompt_logprobs",
               "vllm_seed_repro"]


def _run(*args, timeout=300, cpu=True, script=SCRIPT):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if cpu:  # the CPU path, also on a GPU host
        env["CUDA_VISIBLE_DEVICES"] = ""
    threads = ["--threads", "1"] if script == SCRIPT else []
    proc = subprocess.run([sys.executable, str(script), *threads, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    checks = {}
    for line in lines:
        status, name, *rest = line.split(" ", 2)
        assert status in {"PASS", "FAIL", "SKIP", "INFO"}, line
        if status != "INFO":
            checks[name] = (status, rest[0] if rest else "")
    return proc, checks


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu_check")
    proc, checks = _run("--cpu-only", "--steps", "150", "--workdir", str(work))
    return proc, checks, work


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_parts_pass_and_vllm_parts_skip(cpu_run):
    proc, checks, work = cpu_run
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert list(checks) == CPU_CHECKS + VLLM_CHECKS
    assert all(checks[n][0] == "PASS" for n in CPU_CHECKS), checks
    assert all(checks[n] == ("SKIP", "--cpu-only") for n in VLLM_CHECKS)
    assert (work / "adapter_A" / "adapter_config.json").exists() and (work / "merged_B" / "config.json").exists()


def test_vllm_ready_says_why_not(monkeypatch):
    """Each reason, whatever this host has: no CUDA device, no vllm, or ready."""
    import types

    import torch

    gc = _module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gc.vllm_ready() == "no CUDA device"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    assert gc.vllm_ready().startswith("vllm is not installed")
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    assert gc.vllm_ready() is None


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_vllm_parts_pass_where_vllm_can_run(tmp_path):
    why = _module().vllm_ready()
    if why:
        pytest.skip(f"the vLLM checks need a CUDA device and vllm here: {why}")
    proc, checks = _run("--steps", "150", "--workdir", str(tmp_path), timeout=1100, cpu=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert [n.split("[")[0] for n in checks if not n.startswith("vllm")] == CPU_CHECKS
    assert {n.split("[")[0] for n in checks if n.startswith("vllm")} == set(VLLM_CHECKS), checks
    assert all(status == "PASS" for status, _ in checks.values()), checks


@pytest.mark.parametrize("fails", ["build_base", "build_adapters"])
def test_a_failed_check_exits_nonzero(tmp_path, monkeypatch, capsys, fails):
    gc = _module()
    monkeypatch.setattr(gc, "build_base", lambda *a: (fails != "build_base", "stand-in", tmp_path))
    monkeypatch.setattr(gc, "build_adapters", lambda *a: (False, "stand-in", None))
    assert gc.main(["--cpu-only", "--workdir", str(tmp_path)]) == 1
    lines = [line.split(" ", 2) for line in capsys.readouterr().out.splitlines() if not line.startswith("INFO")]
    assert [name for _, name, _ in lines] == CPU_CHECKS + VLLM_CHECKS  # every check accounted for
    status = {name: st for st, name, _ in lines}
    assert status[fails] == "FAIL" and {status[n] for n in CPU_CHECKS[CPU_CHECKS.index(fails) + 1:]} == {"SKIP"}


def test_vllm_checks_tell_the_right_adapter(cpu_run, capsys):
    """The per-adapter checks, with HF samplers standing in for vLLM's views: the merged model
    the view claims to be passes; another adapter's fails the comparisons."""
    from leakray.models.hf_sampler import HFSampler
    from leakray.models.sampler import SampleConfig

    _, _, work = cpu_run
    gc = _module()
    merged = {None: work / "base", "A": work / "merged_A", "B": work / "merged_B"}
    cfg = SampleConfig(k=gc.K, max_new_tokens=48, dtype="float32", threads=1)
    teachers = {n: gc.Teacher(p) for n, p in merged.items()}
    hf_refs = {n: HFSampler(str(p), cfg).reference_scores(gc.PROMPTS, gc.REFERENCES) for n, p in merged.items()}
    keys = [f"t/{i}" for i in range(len(gc.PROMPTS))]
    tol_max, tol_mean = gc.TOLERANCE["float16"]

    right = gc.Checks()
    gc._check_one(right, HFSampler(str(merged["A"]), cfg), "A", keys, teachers, hf_refs, tol_max, tol_mean)
    out = capsys.readouterr().out
    assert right.failed == 0 and out.count("PASS ") == 5, out
    wrong = gc.Checks()
    gc._check_one(wrong, HFSampler(str(merged["B"]), cfg), "A", keys, teachers, hf_refs, tol_max, tol_mean)
    out = capsys.readouterr().out
    assert "FAIL vllm_vs_hf_ppl[A]" in out and "FAIL vllm_prompt_logprobs[A]" in out, out


MODEL_CHECKS = ["reference_scores", "sample_vs_teacher", "task_seed", "ragged_attention", "ragged_attention",
                "bfloat16", "next_token_draws"]


def test_cuda_check_checks_itself_on_the_cpu(cpu_run, tmp_path):
    """scripts/cuda_check.py with ``--device cpu``: every comparison runs CPU against CPU, so a
    GPU run cannot fail on the script's own mistakes (bf16 is compared on the device only)."""
    _, _, work = cpu_run
    proc, checks = _run("--device", "cpu", "--base", str(work / "base"), "--workdir", str(tmp_path),
                        script=CUDA_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    names = [n.split("[")[0] for n in checks]
    assert names == ["build_gpt2", "build_encoder", *MODEL_CHECKS * 2, "finetune", "finetune", "pretrain_mix",
                     "embed", "cgmia_fit", "advprompt_fit"], names
    skipped = {n for n, (status, _) in checks.items() if status != "PASS"}
    assert skipped == {"ragged_attention[llama,bfloat16]", "ragged_attention[gpt2,bfloat16]"}, checks
    assert checks["finetune[lora]"][1].startswith("trained on cpu")


def test_cuda_check_without_a_gpu_says_so():
    proc, checks = _run("--device", "cuda", script=CUDA_SCRIPT)  # CUDA hidden
    assert proc.returncode == 0 and checks == {"all": ("SKIP", "no CUDA device")}, proc.stdout + proc.stderr
