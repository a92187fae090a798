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
# The kernel itself: Ψ renders CUDA C++, the JIT compiles it for sm_90a (no GPU needed);
# on a machine with an H200, `run` executes it and checks it against the fp64 reference.
step build/comfuse emit "$ex" --shape 8192,4096,4096
step build/comfuse compile "$ex" --shape 8192,4096,4096
if build/comfuse run "$ex" --shape 8192,4096,4096; then
  echo "(ran on the GPU and matched the fp64 reference)"
else
  echo "(no GPU here: the kernel was lowered, planned, emitted and compiled; the CPU reference ran above)"
fi
