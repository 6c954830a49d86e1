#!/usr/bin/env bash
# Create .venv (if missing) and install leakray into it. Torch first: pinning the CPU
# build avoids pip pulling a multi-GB CUDA wheel; GPU clusters install leakray[vllm].
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev]"
