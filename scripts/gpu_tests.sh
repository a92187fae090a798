#!/usr/bin/env bash
# The GPU half of the test suite, in one call on the device machine (see bench/NOTES.md):
# binaries built here by scripts/stage_gpu_carry.sh travel in .carry/, the CUTLASS headers
# in third_party/; the JIT compiles kernels there with that machine's NVRTC.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
rc=0
# Shards run in parallel: each JIT-compiles its own kernels (NVRTC is single-threaded);
# the process-safe cache dedups. Correctness only: nothing here is timed.
shards=${SHARDS:-6}
for t in .carry/bin/test_gpu_*; do
  echo "== $t ($shards shards)"
  pids=()
  for i in $(seq 0 $((shards - 1))); do
    # A hung kernel must not take the whole call with it: each shard has its own limit (on a
    # cold JIT cache test_gpu_reductions' shards take 100-180 s).
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${SHARD_TIMEOUT:-300}" "$t" --gtest_brief=1 \
      > "$out/$(basename "$t").$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; s=$?
    [ $s = 0 ] || { rc=1; echo "shard $i FAILED (exit $s$([ $s = 124 ] && echo ': timed out'))"; }
    grep -E "FAILED|Failure|PASSED|SKIPPED|error" "$out/$(basename "$t").$i.log" | head -20
  done
  # One log per binary: the device tool returns a limited number of files.
  for i in "${!pids[@]}"; do echo "---- shard $i"; cat "$out/$(basename "$t").$i.log"; done > "$out/$(basename "$t").log"
  rm -f "$out/$(basename "$t")".[0-9]*.log
done
echo "== CLI on the GPU"
# RUNS, B2B_RUNS and B2B_AUTO_RUNS replace the lists below; set empty (RUNS=""), they run nothing.
# The JIT path end to end at the benchmark shapes, each timed against cuBLAS GEMM alone in
# the same run (compiles in parallel first, then runs one at a time).
runs="${RUNS-gemm_layernorm:8192,4096,4096 gemm_rmsnorm:8192,4096,4096 gemm_softmax:8192,4096,4096
      gemm_layernorm:4096,8192,4096 gemm_layernorm:256,4096,4096 gemm_softmax:256,4096,4096
      gemm_bias_gelu:4096,4096,4096 gemm_bias_gelu:8192,4096,4096 gemm_bias_gelu:256,4096,4096
      gemm_rmsnorm:8192,4096,4104 gemm_residual_layernorm:8000,4000,1000 gemm_bias_gelu:8192,4096,4104}"
for r in $runs; do .carry/bin/comfuse compile "examples/${r%%:*}.cf" --shape "${r#*:}" > /dev/null 2>&1 & done; wait
for r in $runs; do
  echo "-- ${r%%:*} ${r#*:}" >> "$out/cli.log"
  .carry/bin/comfuse run "examples/${r%%:*}.cf" --shape "${r#*:}" >> "$out/cli.log" 2>&1 || rc=1
done
# B2B pairs (bench/RESULTS.md's B2B rows): shapes as --dim bindings, the B2B kernel forced (the
# planner runs most FFN shapes as two kernels); B2B_AUTO_RUNS as the planner chooses.
b2b_runs="${B2B_RUNS-ffn:M=8192,K=1024,N=4096,D=256 attention:M=16384,N=16384,K=128,DV=128 attention:M=4096,N=4096,K=64,DV=64
  attention_causal:M=16384,N=16384,K=128,DV=128 attention_causal:M=4096,N=4096,K=64,DV=64
  ffn_swiglu:M=128,K=4096,N=11008,D=4096 ffn_swiglu:M=8192,K=1024,N=4096,D=1024
  attention_batched:B=64,M=1024,N=1024,K=128,DV=128 attention_batched_causal:B=64,M=1024,N=1024,K=128,DV=128
  attention_batched_causal:B=64,M=4096,N=4096,K=128,DV=128}"
# The FFN rows of issue 13's table as the planner runs them (two kernels where one does not pay).
b2b_auto_runs="${B2B_AUTO_RUNS-ffn:M=8192,K=1024,N=4096,D=256 ffn:M=8192,K=1024,N=4096,D=1024 ffn:M=128,K=4096,N=16384,D=4096
  ffn:M=64,K=1024,N=3072,D=1024 ffn_swiglu:M=128,K=4096,N=11008,D=4096}"
dims() { echo "${1#*:}" | tr ',' '\n' | sed 's/^/--dim /' | tr '\n' ' '; }
for r in $b2b_runs; do .carry/bin/comfuse compile "examples/${r%%:*}.cf" $(dims "$r") --b2b force > /dev/null 2>&1 & done; wait
for r in $b2b_runs; do
  echo "-- ${r%%:*} ${r#*:} --b2b force" >> "$out/cli.log"
  timeout 120 .carry/bin/comfuse run "examples/${r%%:*}.cf" $(dims "$r") --b2b force >> "$out/cli.log" 2>&1 || rc=1
done
for r in $b2b_auto_runs; do
  echo "-- ${r%%:*} ${r#*:} (--b2b auto)" >> "$out/cli.log"
  timeout 120 .carry/bin/comfuse run "examples/${r%%:*}.cf" $(dims "$r") >> "$out/cli.log" 2>&1 || rc=1
done
cat "$out/cli.log"
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/bin/test_gpu_fused \
      --gtest_filter='Gpu.TwoOutputsAndCasts' --gtest_brief=1 > "$out/sanitizer-$tool.log" 2>&1
    s=$?; tail -3 "$out/sanitizer-$tool.log"; echo "$tool (fused) exit $s"; [ $s = 0 ] || rc=1
    compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/bin/test_gpu_reductions \
      --gtest_filter='GpuReduce.LayerNorm*:GpuReduce.StashInSharedMemory*:GpuReduce.RowGroupsChain*:GpuReduce.RowGroups*InOneRound:GpuReduce.TwoDimensionalClusters:GpuReduce.ThreeConsumerWarpGroupsResidualLayerNorm' --gtest_brief=1 > "$out/sanitizer-$tool-reduce.log" 2>&1
    s=$?; tail -3 "$out/sanitizer-$tool-reduce.log"; echo "$tool (cluster reductions) exit $s"; [ $s = 0 ] || rc=1
    compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/bin/test_gpu_channels --gtest_brief=1 \
      > "$out/sanitizer-$tool-channels.log" 2>&1
    s=$?; tail -3 "$out/sanitizer-$tool-channels.log"; echo "$tool (channels) exit $s"; [ $s = 0 ] || rc=1
    # The B2B family (issue 13 asks its kernels clean under both tools): one FFN, one gated FFN,
    # one attention.
    timeout "${SANITIZE_B2B_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/bin/test_gpu_b2b \
      --gtest_filter='GpuB2b.FeedForwardElementwiseF:GpuB2b.GatedFeedForwardOtherF:GpuB2b.CausalAttentionOnlineSoftmax:GpuB2b.BatchedPairWithPerBatchEpilogueOperands' --gtest_brief=1 \
      > "$out/sanitizer-$tool-b2b.log" 2>&1
    s=$?; tail -3 "$out/sanitizer-$tool-b2b.log"; echo "$tool (b2b) exit $s"; [ $s = 0 ] || rc=1
    # The N1 split over clusters (partial O over DSMEM, b2b/partial_sum.cuh) and paired jobs (one
    # ring read by both consumer warp groups, ordered turns): ~2 min each under racecheck.
    for t in SplitN1OverClusters PairedJobsShareOneRing 'Modes/*/ChainedJobs' 'Modes/*/OverlapTwoXBuffers'; do
      log="$out/sanitizer-$tool-b2b-${t//[^A-Za-z0-9]/}.log"
      timeout "${SANITIZE_SPLIT_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 9 .carry/bin/test_gpu_b2b \
        --gtest_filter="$([[ $t == */* ]] && echo "$t" || echo "GpuB2b.$t")" --gtest_brief=1 > "$log" 2>&1
      s=$?; tail -3 "$log"; echo "$tool (b2b $t) exit $s"; [ $s = 0 ] || rc=1
    done
  done
fi
echo "gpu_tests.sh: exit $rc"
exit $rc
