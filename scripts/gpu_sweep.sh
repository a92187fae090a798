#!/usr/bin/env bash
# Timed `comfuse run`s of forced plan variants on the device machine (bench/NOTES.md):
#   SWEEP=file bash scripts/gpu_sweep.sh     file: one "[NAME=VALUE ...] example M,N,K [plan flags...]" per line
# Compiles every variant in parallel first (NVRTC is single-threaded), then runs them one at
# a time; each run checks against the fp64 reference and times fused vs cuBLAS GEMM alone in
# alternating rounds (same power state). Prints one summary line per variant.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
cli=${CLI:-.carry/bin/comfuse}
read_sweep_and_compile
rc=0
for l in "${lines[@]}"; do
  parse_sweep_line "$l"
  log="$out/sweep.log"
  echo "-- $l" >> "$log"
  if ! env "${line_env[@]}" $cli run "examples/$ex.cf" --shape "$shape" "${line_args[@]}" > "$out/one.log" 2>&1; then rc=1; fi
  cat "$out/one.log" >> "$log"
  k=$(grep -m1 '^kernel:' "$out/one.log" | sed 's/; JIT.*//; s/^kernel: //')
  t=$(grep -m1 '^time:' "$out/one.log" | sed -E 's/.*fused ([0-9.]+) ms.*cuBLAS GEMM alone ([0-9.]+) ms, fused \/ cuBLAS = ([0-9.]+x) \(rounds ([0-9.]+-[0-9.]+);.*/\1 ms vs cuBLAS \2 ms = \3 [\4]/')
  bad=$(grep -c MISMATCH "$out/one.log")
  printf '%-16s %-16s %-34s | %s | %s%s\n' "$ex" "$shape" "${line_env[*]} ${line_args[*]}" "${t:-FAILED: $(tail -1 "$out/one.log")}" "$k" \
    "$([ "$bad" = 0 ] || echo '  MISMATCH')"
done
exit $rc
