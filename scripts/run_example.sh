#!/usr/bin/env bash
# The main job on the running example (GEMM + bias + LayerNorm, examples/gemm_layernorm.cf):
# set up, build the CLI, then show what ComFuse fuses, how it would run the kernel on an
# H200, and that the fused form computes what the graph computes (CPU reference).
#   JOBS=N   parallel build jobs (default 2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh
cmake -S . -B build
cmake --build build -j"${JOBS:-2}" --target comfuse

ex=examples/gemm_layernorm.cf
step() { echo; echo "==> $*"; "$@"; }
step build/comfuse lower "$ex"
step build/comfuse explain "$ex" --shape 8192,4096,4096
step build/comfuse run "$ex" --reference --shape 300,520,64
# HOOK(lead): emit + compile of the fused kernel, and `run --gpu`, go here.
