#!/bin/bash
# scripts/gpu_bench.sh: on the GPU machine, in one call: build bench/gemm_bench.cu if the
# carried binary (build-gemm/gemm_bench) is missing or cannot start, check correctness,
# benchmark against cuBLAS, optionally run compute-sanitizer; logs under $OUT.
#   run: bash scripts/gpu_bench.sh [bench args...]   (carry third_party/cutlass, build-gemm)
#   env: SANITIZE=1 adds compute-sanitizer (memcheck, racecheck) on --check-only --quick;
#        NCU=1 adds one ncu profile of the 4096^3 plain kernel.
set -u -o pipefail
OUT=${OUT:-/tmp/comfuse_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
BIN=build-gemm/gemm_bench
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [ ! -x "$BIN" ] || ldd "$BIN" | grep -q "not found"; then
  echo "== building on the GPU machine"
  mkdir -p build-gemm
  time nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr \
    -I third_party/cutlass/include -I kernels bench/gemm_bench.cu -o "$BIN" -lcublas -lcublasLt \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
BENCH_LOG="$OUT/sweep.log" timeout 420 "$BIN" "$@" 2>&1 | tee "$OUT/bench.log"
rc=$?
echo "bench rc=$rc"
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool "$BIN" --check-only --quick > "$OUT/sanitize_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -4 "$OUT/sanitize_$tool.log"
  done
fi
if [ "${NCU:-0}" = 1 ]; then
  timeout 200 ncu --clock-control none -k regex:fused_gemm --launch-skip 40 --launch-count 1 --set full \
    "$BIN" --reps 5 > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"; grep -E "Duration|Throughput|Registers|Achieved|Warp Cycles|Stall" "$OUT/ncu.txt" | head -40
fi
exit $rc
