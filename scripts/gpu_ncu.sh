#!/usr/bin/env bash
# Cycle counts of forced plan variants under ncu (bench/NOTES.md), free of the power-state
# noise of wall-clock timing (ncu locks the SM clock to base):
#   SWEEP=file bash scripts/gpu_ncu.sh     file: one "[NAME=VALUE ...] example M,N,K [plan flags...]" per line
# Each variant's third fused launch is profiled (the first ones warm the caches and the JIT
# module); one summary line per variant: elapsed cycles, duration, tensor-pipe activity (the SMs'
# mean and the busiest SM's: a one-wave kernel leaves SMs idle, which the mean hides) and L2 load.
# EXTRA_METRICS (comma-separated ncu metric names) adds metrics, printed as name=value after
# them, e.g. the warp stall reasons of bench/sweeps/k1024_epilogue_ncu.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
cli=${CLI:-.carry/bin/comfuse}
read_sweep_and_compile
metrics=gpc__cycles_elapsed.max,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.max.pct_of_peak_sustained_elapsed,lts__t_sectors.avg.pct_of_peak_sustained_elapsed
extra=${EXTRA_METRICS:-}
[ -n "$extra" ] && metrics+=",$extra"
for l in "${lines[@]}"; do
  parse_sweep_line "$l"
  log="$out/ncu-$(echo "$l" | tr -c 'a-zA-Z0-9' _).log"
  timeout 300 ncu --metrics "$metrics" -k regex:comfuse --launch-skip 2 --launch-count 1 \
    env "${line_env[@]}" $cli run "examples/$ex.cf" --shape "$shape" "${line_args[@]}" > "$log" 2>&1
  get() { grep -m1 "$1" "$log" | awk '{print $NF}'; }
  printf '%-16s %-16s %-26s | cycles %s | %s us | tensor %s%% (busiest SM %s%%) | L2 %s%%' "$ex" "$shape" "${line_env[*]} ${line_args[*]}" \
    "$(get gpc__cycles_elapsed.max)" "$(get gpu__time_duration.sum)" \
    "$(get sm__pipe_tensor_op_hmma_cycles_active.avg)" "$(get sm__pipe_tensor_op_hmma_cycles_active.max)" \
    "$(get lts__t_sectors.avg)"
  for m in ${extra//,/ }; do printf ' | %s=%s' "$m" "$(get "$m")"; done
  printf '\n'
done
