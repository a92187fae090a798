#!/usr/bin/env bash
# Per-job timelines of a sweep's variants on the GPU (`comfuse run --trace`, kernels/comfuse/
# debug/trace.cuh): where each case's time goes between mainloops, epilogues, exchange polls
# and the tensor cores' idle gaps.
#   SWEEP=file bash scripts/gpu_trace.sh     file: one "[NAME=VALUE ...] example M,N,K [plan flags...]" per line
# Prints each variant's summary; every stamp goes to $out/traces.tar.gz (one CSV per variant).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
cli=${CLI:-.carry/bin/comfuse}
dir=$(mktemp -d)
# Traced kernels are cache entries of their own: JIT-compile them in parallel first.
TRACE_FLAG=--trace read_sweep_and_compile
for l in "${lines[@]}"; do
  parse_sweep_line "$l"
  name=$(echo "$l" | tr -c 'a-zA-Z0-9' _)
  echo "== $l"
  timeout 300 env "${line_env[@]}" $cli run "examples/$ex.cf" --shape "$shape" "${line_args[@]}" --trace "$dir/$name.csv" 2>&1 | grep -v "^trace: every stamp"
done
tar -czf "$out/traces.tar.gz" -C "$dir" .
