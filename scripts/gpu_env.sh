# Sourced by the device-machine scripts (gpu_tests.sh, gpu_sweep.sh): the carried binaries'
# libraries, the kernel and CUTLASS headers the JIT compiles against on that machine, its
# cache, and $out for logs ($OUT when the device tool provides one). Sets root and out, cd's there.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/comfuse-gpu-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# COMFUSE_KERNELS_DIR may point at a modified copy of kernels/ (A/B of a device change).
export COMFUSE_KERNELS_DIR="${COMFUSE_KERNELS_DIR:-$root/kernels}" COMFUSE_CUTLASS_INCLUDE="$root/third_party/cutlass/include"
export COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/comfuse-cache}"

# Sweep scripts (gpu_sweep.sh, gpu_ncu.sh, gpu_ncu_source.sh, gpu_trace.sh): CLI may name
# another build's comfuse (an A/B of a host change, its kernels in COMFUSE_KERNELS_DIR); the
# variant lines of $SWEEP ("[NAME=VALUE ...] example M,N,K [plan flags...]", # comments) into the
# array `lines`, each variant JIT-compiled in parallel first (NVRTC is single-threaded; the
# process-safe cache then serves the runs).
read_sweep_and_compile() {
  mapfile -t lines < <(grep -v '^\s*#' "${SWEEP:?set SWEEP to a variant file}" | grep -v '^\s*$')
  local l
  for l in "${lines[@]}"; do
    parse_sweep_line "$l"
    # The line's environment too: a COMFUSE_KERNELS_DIR there is another kernel source to compile.
    echo "env ${line_env[*]} ${CLI:-.carry/bin/comfuse} compile examples/$ex.cf --shape $shape ${line_args[*]} ${TRACE_FLAG:-} > /dev/null 2>&1"
  done | xargs -P "${JOBS:-14}" -I{} bash -c "{}"
}

# One variant line: leading NAME=VALUE words are the environment of its run (an A/B switch such
# as COMFUSE_EARLY_B=0), then the example, its M,N,K and the plan flags. Sets line_env, ex,
# shape and line_args; run it as `env "${line_env[@]}" $cli run ... "${line_args[@]}"`.
parse_sweep_line() {
  local -a w
  read -r -a w <<< "$1"
  local i=0
  line_env=()
  while [[ ${w[i]:-} =~ ^[A-Z_][A-Z0-9_]*= ]]; do line_env+=("${w[i]}"); i=$((i + 1)); done
  ex=${w[i]:-}; shape=${w[i + 1]:-}
  line_args=("${w[@]:i+2}")
}
