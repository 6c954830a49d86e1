"""leakray.models.host: the CPU kernels a run's numbers came from, as torch reports them."""

import os
import subprocess
import sys

from leakray.models.host import fingerprint_line, host_fingerprint


def test_fingerprint_names_the_cpu_kernels_and_versions():
    import torch

    fp = host_fingerprint()
    assert fp["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert fp["torch"].split("+")[0] == torch.__version__.split("+")[0] and fp["cpus"] >= 1
    fp["cpu"] = "changed"  # a copy: the cached fingerprint stays intact
    assert host_fingerprint()["cpu"] != "changed"
    line = fingerprint_line(host_fingerprint())
    assert f"**{torch.backends.cpu.get_cpu_capability()}**" in line and "torch " in line


def test_fingerprint_follows_the_kernels_torch_was_told_to_use():
    # ATEN_CPU_CAPABILITY chooses torch's kernels (docs/DESIGN.md measured the demo with two levels);
    # the fingerprint must report the ones in use, not the CPU's best
    code = "from leakray.models.host import host_fingerprint as h; print(h()['torch_cpu_capability'])"
    got = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert got == "DEFAULT"


def test_importing_leakray_makes_openmp_wait_passively_unless_the_user_chose():
    # libgomp's spinning waits burn the cores other processes need (leakray/__init__.py); the
    # variable must be set before torch loads libgomp, i.e. by importing any leakray module
    code = "import os, leakray.models.host, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}

    def policy(extra: dict) -> str:
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert policy({}) == "PASSIVE"
    assert policy({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"  # the user's own choice stays
