"""Which kernels computed a run's numbers: the CPU, the vector instruction set torch dispatches
to on it, and the versions of the libraries that own those kernels.

Why a report carries it: on one kind of host the demo's numbers repeat to the printed digits,
but torch (and MKL below it) pick other kernels on another CPU, so fine-tuned weights differ
in their last bits and fifteen epochs of fine-tuning amplify that. Measured on one host, the
same code, seeds and cached base (docs/DESIGN.md, "Reproducing a run"): AdvPrompt-MIA's target AUC was
0.81 with torch's AVX-512 kernels and 0.90 with its AVX2 kernels (`ATEN_CPU_CAPABILITY=avx2`),
masked span 0.90 and 0.93, CGMIA 0.88 and 0.87; another CPU gave a fourth table. A reader
comparing two reports needs to know whether such a difference is the code or the host.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from importlib import metadata

LIBRARIES = ("torch", "transformers", "numpy", "scikit-learn")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def host_fingerprint() -> dict:
    """This process's host: {"python", "machine", "cpu", "cpus", "torch_cpu_capability"
    (e.g. "AVX512", "AVX2", "DEFAULT"; it follows $ATEN_CPU_CAPABILITY), library versions}."""
    return dict(_fingerprint())


@lru_cache(maxsize=1)
def _fingerprint() -> dict:
    import torch

    return {"python": platform.python_version(), "machine": platform.machine(), "cpu": _cpu_model(),
            "cpus": os.cpu_count(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            **{lib: _version(lib) for lib in LIBRARIES}}


def fingerprint_line(fp: dict) -> str:
    """One line for a Markdown report."""
    libs = ", ".join(f"{lib} {fp[lib]}" for lib in LIBRARIES if fp.get(lib))
    return (f"Computed on {fp.get('cpu')} ({fp.get('cpus')} CPUs, {fp.get('machine')}), torch's CPU kernels "
            f"**{fp.get('torch_cpu_capability')}**; Python {fp.get('python')}, {libs}. Numbers repeat on the same "
            "kind of CPU; another CPU's kernels give other floating-point results (docs/DESIGN.md).")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation here, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not Linux
        return None


def stored_dtype(path: str):
    """The floating-point dtype a checkpoint's config says its weights are stored in; None when it
    says none (transformers then reads the weights' own)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return getattr(torch, stored) if isinstance(stored, str) else stored


def _weight_bytes(path: str) -> int | None:
    from pathlib import Path

    files = [f for pattern in ("*.safetensors", "*.bin") for f in Path(path).glob(pattern)] \
        if Path(path).is_dir() else []
    return sum(f.stat().st_size for f in files) or None


def load_dtype(requested: str, path: str, device: str):
    """The dtype to load a model for inference in. A dtype named in the config is taken as it is;
    ``auto`` is the checkpoint's own, except on the CPU: there a 16-bit checkpoint loads as
    float32 when float32 weights take at most half the memory available (a config naming no dtype:
    float32 on a CPU, the weights' own elsewhere). On this project's 2-core CPU a GPT-2-small-sized
    model sampled 27x slower in bfloat16 than in float32, and scored references 67x slower
    (benchmarks/bench_cpu_dtype.py; torch has no fast bfloat16 matrix products on a CPU without
    AVX512-BF16/AMX; transformers 5 loads a bf16 checkpoint, what code LLMs ship, as bf16). A
    checkpoint too large for float32 keeps its own dtype (slow, but it fits), with a warning."""
    import logging

    import torch

    if requested != "auto":
        return getattr(torch, requested)
    stored = stored_dtype(path)
    if device != "cpu":
        return stored or "auto"  # the checkpoint's own (the weights' when the config names none)
    if stored is None or stored.itemsize != 2:
        return stored or torch.float32
    size, free = _weight_bytes(path), available_memory()
    if size is not None and free is not None and size * 4 // stored.itemsize > free // 2:
        logging.getLogger(__name__).warning(
            "%s: %s weights, loaded as they are on the CPU (float32 would take %.1f GB of the %.1f GB "
            "available); bfloat16/float16 matrix products are slow on most CPUs", path,
            str(stored).removeprefix("torch."), size * 4 / stored.itemsize / 1e9, free / 1e9)
        return stored
    return torch.float32


def runnable_device(device: str) -> str:
    """``device``, or the CPU where it names a GPU this process has none of. For a trained model
    being loaded to score (a small network): CGMIA trained on a Ray Train GPU worker comes back to
    the driver, which on a cluster's CPU head has no GPU; a card built on a GPU is reused on a
    laptop. The weights are the same wherever they run."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return "cpu"
    return device
