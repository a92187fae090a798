# Sourced by the device-machine scripts (gpu_tests.sh, gpu_sweep.sh): the carried binaries'
# libraries, the kernel and CUTLASS headers the JIT compiles against on that machine, its
# cache, and $out for logs ($OUT when the device tool provides one). Sets root and out, cd's there.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/comfuse-gpu-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$root/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export COMFUSE_KERNELS_DIR="$root/kernels" COMFUSE_CUTLASS_INCLUDE="$root/third_party/cutlass/include"
export COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/comfuse-cache}"
