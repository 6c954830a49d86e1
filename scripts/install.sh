#!/usr/bin/env bash
# Create .venv (if missing) and install leakray into it. Torch pinned (torch==2.13.0, the CPU
# build where the machine keeps one): a range would pull a multi-GB CUDA wheel; GPU clusters
# install leakray[vllm].
# The sandbox needs bubblewrap for real isolation: installed here where we can (root or
# passwordless sudo); otherwise leakray refuses to run generated code and says how to fix it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    (sudo -n apt-get update -qq && sudo -n apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || true
  fi
  command -v bwrap >/dev/null 2>&1 \
    && echo "installed bubblewrap (the sandbox's isolation)" \
    || echo "WARNING: bubblewrap is not installed and could not be installed here; leakray will refuse to" \
            "run generated code until it is (apt-get install bubblewrap) or you opt in to weaker isolation" \
            "with --set execute.allow_weak_isolation=true" >&2
fi
PY=${PYTHON:-python3}
FRESH=0
[ -x .venv/bin/python ] || { "$PY" -m venv .venv; FRESH=1; }
. .venv/bin/activate
TORCH=()
python -c "import torch" 2>/dev/null || TORCH=("torch==2.13.0")
# A fresh environment: uv installs it, in parallel, with pip's settings (scripts/uv_install.py; the
# same packages, benchmarks/bench_install.py). Where uv cannot be had or a pip setting has no uv
# equivalent, in an existing environment, and with LEAKRAY_INSTALLER=pip, pip does it as before.
TRY_UV=0
[ "$FRESH" = 1 ] && echo "installing torch and leakray[dev] into a new .venv/ (about a minute on 2 cores) ..."
[ "$FRESH" = 1 ] && [ "${LEAKRAY_INSTALLER:-uv}" != pip ] && TRY_UV=1
UV_DONE=0
if [ "$TRY_UV" = 1 ] && python -m pip install -q uv >/dev/null 2>&1 \
   && python scripts/uv_install.py -q ${TORCH[@]+"${TORCH[@]}"} -e ".[dev]"; then
  UV_DONE=1
fi
if [ "$UV_DONE" = 0 ]; then
  [ "$TRY_UV" = 1 ] && echo "uv could not install this environment here (see above); installing with pip, which takes longer"
  python -m pip install -q --upgrade pip
  # A fresh environment is byte-compiled once at the end on every core: pip compiles each file it
  # installs one after another, a large part of a fresh install (~23,000 files). An existing
  # environment keeps pip's own compiling, so whatever an upgrade adds is compiled too.
  NO_COMPILE=()
  [ "$FRESH" = 1 ] && NO_COMPILE=(--no-compile)
  # torch first: pinning the CPU build before anything asks for a range
  [ ${#TORCH[@]} = 0 ] || python -m pip install -q ${NO_COMPILE[@]+"${NO_COMPILE[@]}"} "${TORCH[@]}"
  python -m pip install -q ${NO_COMPILE[@]+"${NO_COMPILE[@]}"} -e ".[dev]"
fi
if [ "$FRESH" = 1 ]; then
  # purelib and platlib (lib/ and lib64/ on some distributions: packages with extensions go to the
  # latter); a file that does not compile (a template, a test fixture) stays as pip leaves it.
  # Compiled ahead because a machine may set PYTHONDONTWRITEBYTECODE (this project's hosts do): then
  # no import ever writes a .pyc and every process compiles what it imports, every time (the quick
  # demo took 178 s in a venv left uncompiled, 109 s in the same venv compiled). Packages' own test
  # suites (a `tests` directory inside a package: 3,345 of ~22,700 files here) are never imported,
  # and not compiled.
  echo "byte-compiling .venv/ on every core ..."
  python - >/dev/null 2>&1 <<'PY' || true
import compileall, re, sysconfig
paths = sysconfig.get_paths()
for d in dict.fromkeys((paths["purelib"], paths["platlib"])):
    compileall.compile_dir(d, quiet=2, workers=0, rx=re.compile(re.escape(d) + r"/.+/tests/"))
PY
fi
# The junit5 runner (NaturalCodeBench's Java tests: Jupiter, and JUnit 4 on the vintage engine) needs one
# consistent set of JUnit jars; Debian's junit5 package is one (it pulls junit4, hamcrest, opentest4j),
# and once installed nothing is fetched at run time. Only where a JDK is there and no complete set is.
if command -v javac >/dev/null 2>&1 && ! python -c "import sys; from leakray.sandbox.java import junit_jars, junit_has_vintage
j = junit_jars(); sys.exit(0 if j and junit_has_vintage(j) else 1)"; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq junit5) >/dev/null 2>&1 || true
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    (sudo -n apt-get update -qq && sudo -n DEBIAN_FRONTEND=noninteractive apt-get install -y -qq junit5) >/dev/null 2>&1 || true
  fi
  [ -f /usr/share/java/junit-vintage-engine.jar ] && echo "installed JUnit (Debian's junit5) for the junit5 runner" \
    || echo "WARNING: no JUnit jars with the vintage engine; JUnit 4 tests under the junit5 runner will be" \
            "refused (apt-get install junit5, or set LEAKRAY_JUNIT_CLASSPATH)" >&2
fi
