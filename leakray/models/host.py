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
