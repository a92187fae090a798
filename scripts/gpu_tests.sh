#!/usr/bin/env bash
# The GPU half of the test suite, in one call on the device machine (see bench/NOTES.md):
# binaries built here by scripts/stage_gpu_carry.sh travel in .carry/, the CUTLASS headers
# in third_party/; the JIT compiles kernels there with that machine's NVRTC.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/comfuse-gpu-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export COMFUSE_KERNELS_DIR="$root/kernels" COMFUSE_CUTLASS_INCLUDE="$root/third_party/cutlass/include"
export COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/comfuse-cache}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
rc=0
for t in .carry/bin/test_gpu_*; do
  log="$out/$(basename "$t").log"
  echo "== $t"; "$t" --gtest_brief=1 > "$log" 2>&1; s=$?
  tail -25 "$log"; [ $s = 0 ] || rc=1
done
echo "== CLI on the GPU"
for ex in gemm_bias_gelu; do
  for shape in 1000,1032,72 8192,4096,4096; do
    .carry/bin/comfuse run "examples/$ex.cf" --shape "$shape" >> "$out/cli.log" 2>&1 || rc=1
  done
done
cat "$out/cli.log"
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/bin/test_gpu_fused \
      --gtest_filter='Gpu.TwoOutputsAndCasts:Gpu.EveryClusterSize' --gtest_brief=1 > "$out/sanitizer-$tool.log" 2>&1
    s=$?; tail -4 "$out/sanitizer-$tool.log"; echo "$tool exit $s"; [ $s = 0 ] || rc=1
  done
fi
echo "gpu_tests.sh: exit $rc"
exit $rc
