"""A fresh install, pip against uv, side by side: what `bash scripts/install.sh` costs a new user.

For each arm: a fresh clone of this repository's HEAD, a new HOME (empty pip and uv caches),
then `bash scripts/install.sh` with ``LEAKRAY_INSTALLER=pip`` (pip installs torch, then
leakray[dev]) or without it (uv installs both, scripts/uv_install.py), timed as a whole, byte
compiling and the rest of the script included. Then each environment's packages (`pip freeze`,
names normalised; pip, setuptools and uv themselves aside) compared: the arms must install the
same versions. ``--rounds 2`` runs pip, uv, uv, pip, so an hour's drift falls on both arms.

    python benchmarks/bench_install.py [--rounds 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

TOOLS = {"pip", "setuptools", "uv", "wheel"}


def install(root: Path, installer: str) -> tuple[float, dict[str, str]]:
    repo = Path(__file__).resolve().parents[1]
    clone, home = root / "clone", root / "home"
    shutil.rmtree(root, ignore_errors=True)
    home.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "LEAKRAY", "PYTHONPATH"))}
    env.update(HOME=str(home), PATH=":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p))
    if installer == "pip":
        env["LEAKRAY_INSTALLER"] = "pip"
    t0 = time.perf_counter()
    subprocess.run(["bash", "scripts/install.sh"], cwd=clone, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    frozen = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pip", "freeze", "--all"], env=env,
                            capture_output=True, text=True, check=True).stdout
    return wall, packages(frozen)


def packages(frozen: str) -> dict[str, str]:
    """name (normalised as PEP 503 does) -> version; the editable project by its name alone."""
    out = {}
    for line in frozen.splitlines():
        if line.startswith("-e "):
            out["leakray"] = "editable"
        elif "==" in line:
            name, version = line.split("==", 1)
            name = re.sub(r"[-_.]+", "-", name).lower()
            if name not in TOOLS:
                out[name] = version
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keep", help="directory for the clones (default: a temporary one, removed)")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="leakray-install-"))
    order = [arm for r in range(args.rounds) for arm in (("pip", "uv") if r % 2 == 0 else ("uv", "pip"))]
    walls: dict[str, list[float]] = {"pip": [], "uv": []}
    envs: dict[str, dict[str, str]] = {}
    for i, arm in enumerate(order):
        wall, envs[arm] = install(root / f"{i}-{arm}", arm)
        walls[arm].append(wall)
        print(f"{arm:<4} {wall:7.1f} s  ({len(envs[arm])} packages)", flush=True)
    pip, uv = (sum(walls[a]) / len(walls[a]) for a in ("pip", "uv"))
    print(f"\n`bash scripts/install.sh` in a fresh clone and HOME: pip {pip:.1f} s, uv {uv:.1f} s, "
          f"pip / uv {pip / uv:.2f}x")
    differ = sorted(n for n in envs["pip"].keys() | envs["uv"].keys() if envs["pip"].get(n) != envs["uv"].get(n))
    print("the same packages at the same versions" if not differ else
          "packages that differ: " + ", ".join(f"{n} {envs['pip'].get(n)} / {envs['uv'].get(n)}" for n in differ))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
