#!/bin/bash
# scripts/gpu_bench.sh: on the GPU machine, in one call: build bench/gemm_bench.cu if the
# carried binary (build-gemm/gemm_bench) is missing or cannot start, check correctness,
# benchmark against cuBLAS, optionally run compute-sanitizer; logs under $OUT.
#   run: bash scripts/gpu_bench.sh [bench args...]   (carry third_party/cutlass, build-gemm)
#   env: SANITIZE=1 adds compute-sanitizer (memcheck, racecheck) on --check-only --quick;
#        SAN_FILTER=pat[,pat] limits the sanitizer runs to matching variants;
#        NCU=1 adds ncu --set full profiles (8192x4096x4096) of cuBLAS and of the variants
#        named by NCU_VARIANTS (comma-separated name substrings, bench --profile), run first.
#   The bench binary is built here against a snapshot of the headers when the tree's
#   headers are mid-edit by someone else (carry it); the GPU side only rebuilds if missing.
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
if command -v cuobjdump > /dev/null; then
  cuobjdump -sass "$BIN" > /tmp/sass.txt 2>&1
  echo "SASS: $(grep -c HGMMA /tmp/sass.txt) HGMMA, $(grep -c 'WARPGROUP.DEPBAR\|WARPGROUP.ARRIVE' /tmp/sass.txt) warpgroup syncs, $(grep -cE '\bLDL|\bSTL' /tmp/sass.txt) LDL/STL" | tee "$OUT/sass_summary.txt"
fi
if [ "${NCU:-0}" = 1 ]; then
  timeout 240 ncu --clock-control none --set full -k regex:'gemm|nvjet|xmma|sm90' --launch-skip 1 --launch-count ${NCU_COUNT:-3} \
    "$BIN" --profile 8192 4096 4096 "${NCU_VARIANTS:-coop 128x256 s4 c1 NxK}" > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Grid Size|Cluster Size|Shared Memory Configuration Size|Executed Ipc Active|Issue Slots Busy|One or More Eligible|No Eligible|DRAM Throughput|L2 Cache Throughput|SM Busy" "$OUT/ncu.txt" | head -80
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 200 \
  > "$OUT/smi.csv" 2>&1 &
SMI_PID=$!
BENCH_LOG="$OUT/sweep.log" timeout 420 "$BIN" "$@" 2>&1 | tee "$OUT/bench.log"
rc=$?
echo "bench rc=$rc"
kill $SMI_PID 2>/dev/null
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool "$BIN" --check-only --quick ${SAN_FILTER:+--filter "$SAN_FILTER"} \
      > "$OUT/sanitize_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -4 "$OUT/sanitize_$tool.log"
  done
fi
exit $rc
