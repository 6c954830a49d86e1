"""The layers are enforced by import-linter (contracts in pyproject.toml), not by convention:
the contracts hold for the package as it is, and they break when a domain package imports
the executor or a protocol, or when a stage imports Ray."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())", "pyproject.toml", "--no-cache"]


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(LINT, cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)


def test_the_package_keeps_its_layers():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout and "KEPT" in out.stdout


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("layers")
    shutil.copytree(ROOT / "leakray", root / "leakray", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("module, line, broken", [
    ("detect/upward.py", "from leakray.executor import batches\n", "leakray.detect.upward -> leakray.executor"),
    ("data/upward.py", "import leakray.protocols.simulate\n", "leakray.data.upward -> leakray.protocols"),
    ("stages/on_ray.py", "import ray\n", "leakray.stages.on_ray -> ray"),
])
def test_a_wrong_import_breaks_a_contract(copy, module, line, broken):
    bad = copy / "leakray" / module
    bad.write_text(line)
    try:
        out = lint(copy)
    finally:
        bad.unlink()
    assert out.returncode != 0
    assert "BROKEN" in out.stdout and broken in out.stdout, out.stdout
