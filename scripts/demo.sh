#!/usr/bin/env bash
# Install, then run the offline demo: the CGMIA simulated-leakage protocol on HumanEval.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
exec leakray demo "$@"
