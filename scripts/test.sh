#!/usr/bin/env bash
# Install, then run the whole test suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
exec python -m pytest -q "$@"
