#!/usr/bin/env bash
# Install, then run the whole test suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
# Two test workers (pytest-xdist) on a 2-core machine, up to four on larger ones: most tests wait on
# subprocesses, sandboxes and compilers as much as they compute. The tests on the real head node
# (and the shared model cache) stay together in one worker (tests/conftest.py).
exec python -m pytest -q -n auto --maxprocesses 4 --dist loadgroup "$@"
