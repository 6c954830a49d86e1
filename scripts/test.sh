#!/usr/bin/env bash
# Install, then run the whole test suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
# Two test workers (pytest-xdist) on a 2-core machine, up to four on larger ones: most tests wait on
# subprocesses, sandboxes, compilers and Ray's start-up as much as they compute. Each worker has its
# own session fixtures (its own model cache).
# The tests on the real Ray head (the end-to-end protocols) run one after another on one worker and
# one head, the others share out the rest (the scheduler in tests/conftest.py).
# --durations: where the suite's time goes, printed at the end of every run (CI's log included)
exec python -m pytest -q -n auto --maxprocesses 4 --durations=30 "$@"
