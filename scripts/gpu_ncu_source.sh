#!/usr/bin/env bash
# Where a kernel's warps wait, per SASS instruction (ncu's source counters: warp-state samples
# by stall reason), for each variant of a sweep file:
#   SWEEP=file bash scripts/gpu_ncu_source.sh     file: one "[NAME=VALUE ...] example M,N,K [plan flags...]" per line
# One tarball comes back ($out/ncu_source.tar.gz: per variant the details page and the SASS
# source page as CSV); read it here with scripts/ncu_source_summary.py.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
cli=${CLI:-.carry/bin/comfuse}
read_sweep_and_compile
dir=$(mktemp -d)
for l in "${lines[@]}"; do
  parse_sweep_line "$l"
  name=$(echo "$l" | tr -c 'a-zA-Z0-9' _)
  # The third fused launch: the first ones warm the caches and load the JIT module.
  timeout 300 ncu --section SourceCounters --section WarpStateStats --section SchedulerStats -k regex:comfuse \
    --launch-skip 2 --launch-count 1 --import-source no -f -o "$dir/$name" \
    env "${line_env[@]}" $cli run "examples/$ex.cf" --shape "$shape" "${line_args[@]}" > "$dir/$name.run.log" 2>&1
  echo "== $l: ncu exit $?"
  ncu --import "$dir/$name.ncu-rep" --page details > "$dir/$name.details.txt" 2>&1
  ncu --import "$dir/$name.ncu-rep" --page source --csv --print-source sass > "$dir/$name.sass.csv" 2>/dev/null
  grep -E "Issued Warp Per Scheduler|Eligible Warps|Warp Cycles Per Issued" "$dir/$name.details.txt"
  rm -f "$dir/$name.ncu-rep"
done
tar -czf "$out/ncu_source.tar.gz" -C "$dir" .
