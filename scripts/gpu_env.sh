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

# Sweep scripts (gpu_sweep.sh, gpu_ncu.sh): CLI may name another build's comfuse (an A/B of a
# host change, its kernels in COMFUSE_KERNELS_DIR); the variant lines of $SWEEP ("example M,N,K
# [plan flags...]", # comments) into the array `lines`, each variant JIT-compiled in parallel
# first (NVRTC is single-threaded; the process-safe cache then serves the runs).
read_sweep_and_compile() {
  mapfile -t lines < <(grep -v '^\s*#' "${SWEEP:?set SWEEP to a variant file}" | grep -v '^\s*$')
  local l
  for l in "${lines[@]}"; do
    set -- $l; local ex=$1 shape=$2; shift 2
    echo "${CLI:-.carry/bin/comfuse} compile examples/$ex.cf --shape $shape $* ${TRACE_FLAG:-} > /dev/null 2>&1"
  done | xargs -P "${JOBS:-14}" -I{} bash -c "{}"
}
