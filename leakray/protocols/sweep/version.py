"""The code version a sweep cell is keyed by: the package version plus the git commit of the
checkout the package was imported from (when it is one); `LEAKRAY_CODE_VERSION` overrides
both (a submitted job's working dir has no .git, so a scheduler can pin the version it ships)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import leakray

ENV = "LEAKRAY_CODE_VERSION"


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """HEAD of the checkout holding this package, or None (installed wheel, no git, no repo)."""
    root = Path(leakray.__file__).resolve().parent.parent
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = top.stdout.split()
    # only our own checkout counts, not a repository that happens to contain site-packages
    if top.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root:
        return None
    return lines[1]


def code_version() -> str:
    """Path-safe, e.g. '0.1.0+g85cc478a1b2c' or '0.1.0' without a checkout."""
    pinned = os.environ.get(ENV)
    if pinned:
        return re.sub(r"[^A-Za-z0-9._+-]", "_", pinned)
    commit = git_commit()
    return f"{leakray.__version__}+g{commit[:12]}" if commit else leakray.__version__
