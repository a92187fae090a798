#!/usr/bin/env bash
# The tests: install pinned dependencies (idempotent), build everything in build/, run
# every CTest test (GPU tests skip themselves with a message when no GPU is present),
# build and install the Python package (pyproject.toml) into build/pyvenv and run its
# tests (tests/python: CPU tests; the GPU ones skip with a message without an sm_90 GPU),
# then a short libFuzzer run over the text parsers when scripts/fuzz.sh exists.
#   JOBS=N   parallel build jobs (default 2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh
cmake -S . -B build
cmake --build build -j"${JOBS:-2}"
(cd build && ctest --output-on-failure)
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[test] no GPU on this machine: the tests/gpu/ cases above were SKIPPED, not run;"
  echo "[test] they run on the GPU machine through scripts/gpu_tests.sh (see README, GPU tests)"
fi

# The Python package, as `pip install .` builds it (without build isolation: the venv has
# the pinned build requirements), then its tests.
py="$root/build/pyvenv/bin/python"
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps "$root"
(cd "$root/tests/python" && "$py" -m pytest -q -rs --durations=5 .)

if [[ -f scripts/fuzz.sh ]]; then
  bash scripts/fuzz.sh 60
else
  echo "[test] scripts/fuzz.sh not present: fuzzing skipped"
fi
echo "[test] all tests passed"
