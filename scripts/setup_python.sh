#!/usr/bin/env bash
# The Python side of the setup: a virtual environment in build/pyvenv with the pinned packages
# of python/requirements-ci.txt (torch 2.11 as on the GPU machine: its Linux wheel is a CUDA
# build that imports on a CPU-only machine; ~5 GB with its nvidia-* wheels, ~1.5 min to
# install, then cached by pip), nanobind and scikit-build-core to build the package without
# build isolation, pytest. Safe to re-run: nothing happens while the requirements are unchanged.
#   PYTHON=python3.X   the interpreter to base the venv on (default python3, >= 3.10)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/build/pyvenv"
req="$root/python/requirements-ci.txt"
py="${PYTHON:-python3}"
if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "[setup] $py is older than 3.10: the Python package needs 3.10 or newer" >&2
  exit 1
fi
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then
  echo "[setup] Python venv ready ($venv)"
  exit 0
fi
echo "[setup] Python venv: installing python/requirements-ci.txt into $venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
echo "[setup] Python venv ready ($venv)"
