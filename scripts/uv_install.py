"""`uv pip install ARGS` with this machine's pip settings: what scripts/install.sh runs in a
fresh environment.

pip installs one package after another and then compiles each file; uv (a pip-compatible
installer, installed into the new environment from the package index) downloads and installs
in parallel: on a 2-core host a fresh `leakray[dev]` environment took 58 s with pip (torch 15 s,
the rest 43 s) and 8-16 s with uv, the same 168 packages at the same versions (`pip freeze` of
both environments, uv itself aside; the whole install script, compile included:
benchmarks/bench_install.py).

uv does not read pip's configuration (pip.conf, PIP_* variables), where a machine may keep a
local wheel directory, a mirror or a constraints file (this project's hosts pin torch's CPU
build that way). The settings `pip config list` reports are translated to uv's flags; uv then
picks the best version over all indexes, as pip does (`--index-strategy unsafe-best-match`).
A setting this script does not know exits with status 3 before anything is installed, and
install.sh then installs with pip, so an unusual pip configuration is never half-honoured.

    python scripts/uv_install.py [-q] PACKAGE_OR_-e ...
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

UNKNOWN_SETTING = 3
# pip settings with an equivalent uv flag; a list-valued one is whitespace-separated in pip
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
BOOLEAN_FLAGS = {"no-index": "--no-index"}
# settings uv takes from the environment instead
ENV = {"cert": ("SSL_CERT_FILE",), "timeout": ("UV_HTTP_TIMEOUT",), "default-timeout": ("UV_HTTP_TIMEOUT",),
       "proxy": ("HTTPS_PROXY", "HTTP_PROXY")}
# settings that only change how pip itself talks to its user
IGNORED = {"disable-pip-version-check", "no-input", "progress-bar", "root-user-action", "quiet", "verbose",
           "no-warn-script-location", "no-color"}
# where a key is set more than once, the later scope wins (pip: environment over files, the
# install command's section over global)
SCOPES = ("global", "install", ":env:")


def pip_settings() -> dict[str, str]:
    """pip's effective settings for `pip install`, from `pip config list` (key -> raw value)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    found: dict[str, tuple[int, str]] = {}
    for line in out.stdout.splitlines():
        name, sep, value = line.partition("=")
        scope, _, key = name.rpartition(".")
        if not sep or scope not in SCOPES:
            continue
        rank = SCOPES.index(scope)
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, ast.literal_eval(value) if value[:1] in "'\"" else value)
    return {k: v for k, (_, v) in found.items()}


def uv_command(settings: dict[str, str]) -> tuple[list[str], dict[str, str]] | None:
    """uv's flags and environment for pip's settings, or None when one has no known equivalent."""
    flags, env = ["--index-strategy", "unsafe-best-match"], {}
    for key, value in settings.items():
        if key in FLAGS:
            for item in value.split():
                flags += [FLAGS[key], item]
        elif key in BOOLEAN_FLAGS:
            if value.lower() in ("1", "true", "yes", "on"):
                flags.append(BOOLEAN_FLAGS[key])
        elif key in ENV:
            env.update(dict.fromkeys(ENV[key], value))
        elif key not in IGNORED:
            print(f"uv_install: pip setting {key!r} has no uv equivalent here; installing with pip", file=sys.stderr)
            return None
    return flags, env


def main(argv: list[str]) -> int:
    from uv import find_uv_bin

    try:
        settings = pip_settings()
    except (OSError, subprocess.CalledProcessError, ValueError, SyntaxError) as exc:
        print(f"uv_install: pip's settings could not be read ({exc}); installing with pip", file=sys.stderr)
        return UNKNOWN_SETTING
    got = uv_command(settings)
    if got is None:
        return UNKNOWN_SETTING
    flags, env = got
    cmd = [find_uv_bin(), "pip", "install", "--python", sys.executable, *flags, *argv]
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
