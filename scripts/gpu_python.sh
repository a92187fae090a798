#!/usr/bin/env bash
# The Python package on the GPU machine, in one call: build and install it into that machine's
# Python (torch 2.11 + transformers already there; no network), run tests/python (CPU and GPU
# tests) and the model benchmark (bench/models.py). Needs, carried into the checkout:
#   .pycarry/            from scripts/stage_gpu_python.sh (fmt, spdlog, nlohmann-json, xxHash)
#   third_party/cutlass  the CUTLASS headers the JIT compiles kernels against
# Logs and results go to $OUT (default /tmp/comfuse-gpu-out), at most 8 files:
#   summary.txt build.log pytest.log models.log RESULTS.md results.json speedups.png
# Phases (default: all of them, in this order): build test bench. A call limited in time can
# run them one by one (a warm machine keeps the build and the JIT cache):
#   bash scripts/gpu_python.sh build test      bash scripts/gpu_python.sh bench
#   PYTHON=...        interpreter (default /opt/torch/.venv/bin/python3, else python3)
#   BENCH_SCRIPT=...  the benchmark the bench phase runs (default bench/models.py; bench/matrix.py
#                     is the epilogue matrix: give it BENCH_ARGS, e.g. "--quick --budget-s 420")
#   BENCH_ARGS="..."  its arguments (default: --quick --layers 2 --budget-s 420)
#   TEST_ARGS="..."   what pytest runs instead of the whole folder, split on spaces (files or test ids,
#                     e.g. "test_gpu.py test_gpu_b2b.py::test_ffn")
#   TEST_K="..."      a pytest -k expression, passed whole (e.g. "llama or measured")
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/comfuse-gpu-out}"; mkdir -p "$out"
py="${PYTHON:-/opt/torch/.venv/bin/python3}"
[[ -x "$py" ]] || py="$(command -v python3)"
prefix="$root/.pycarry/prefix/usr"
[[ -d "$prefix" ]] || { echo "missing .pycarry (run scripts/stage_gpu_python.sh where apt works)" | tee -a "$out/summary.txt"; exit 1; }
export CMAKE_PREFIX_PATH="$prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$prefix/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="$(dirname "$py"):/usr/local/cuda/bin:$PATH"
export COMFUSE_CUTLASS_INCLUDE="$root/third_party/cutlass/include"
export COMFUSE_CACHE_DIR="${COMFUSE_CACHE_DIR:-/tmp/comfuse-cache}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
phases=("$@"); ((${#phases[@]})) || phases=(build test bench)
rc=0
note() { echo "$*" | tee -a "$out/summary.txt"; }
note "== $(date -u +%FT%TZ) gpu_python.sh ${phases[*]} ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1))"
note "python $("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1)"

for phase in "${phases[@]}"; do
  t0=$SECONDS
  case "$phase" in
  build)
    # An extension module needs the interpreter's headers (python3.X-dev); say so plainly.
    inc="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    if [[ ! -f "$inc/Python.h" ]]; then
      note "build: no Python.h under $inc: this interpreter has no development headers (python3.X-dev); cannot build"
      exit 1
    fi
    note "build: $("$py" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("nanobind", "scikit-build-core", "torch", "transformers")))' 2>&1); cmake $(cmake --version | head -1 | cut -d' ' -f3)"
    # pip builds the wheel with the machine's scikit-build-core and nanobind (no isolation, no
    # network); if that fails (e.g. an older scikit-build-core), plain CMake builds the module
    # into python/comfuse and PYTHONPATH points there.
    if "$py" -m pip install --no-build-isolation --no-deps -v "$root" > "$out/build.log" 2>&1; then
      note "build: pip install ok ($((SECONDS - t0)) s)"
    else
      note "build: pip install FAILED (tail of build.log below); trying plain CMake"
      tail -15 "$out/build.log" | tee -a "$out/summary.txt"
      if { cmake -S "$root" -B "$root/build/gpu-python" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMFUSE_PYTHON=ON \
             -DCOMFUSE_TOOLS_AND_TESTS=OFF -DPython_EXECUTABLE="$py" &&
           cmake --build "$root/build/gpu-python" --target _core; } >> "$out/build.log" 2>&1; then
        cp "$root"/build/gpu-python/_core*.so "$root/python/comfuse/"
        note "build: CMake ok ($((SECONDS - t0)) s): using PYTHONPATH=python"
      else
        note "build: CMake FAILED too (build.log)"; tail -20 "$out/build.log" | tee -a "$out/summary.txt"; exit 1
      fi
    fi
    ;;
  test)
    [[ -e "$root/python/comfuse/_core.so" || -n "$(ls "$root"/python/comfuse/_core*.so 2>/dev/null)" ]] && export PYTHONPATH="$root/python"
    (cd "$root/tests/python" && timeout "${TEST_TIMEOUT:-540}" "$py" -m pytest -q -rsx --durations=15 ${TEST_K:+-k "$TEST_K"} ${TEST_ARGS:-.} ) \
      > "$out/pytest.log" 2>&1
    s=$?; [[ $s == 0 ]] || rc=1
    note "test: pytest exit $s ($((SECONDS - t0)) s): $(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)' "$out/pytest.log" | tail -1)"
    grep -E "^(FAILED|ERROR|XFAIL)" "$out/pytest.log" | head -20 | tee -a "$out/summary.txt"
    ;;
  bench)
    [[ -n "$(ls "$root"/python/comfuse/_core*.so 2>/dev/null)" ]] && export PYTHONPATH="$root/python"
    # models.py logs to models.log itself; its stderr (warnings, tracebacks) joins it.
    timeout "${BENCH_TIMEOUT:-560}" "$py" "$root/${BENCH_SCRIPT:-bench/models.py}" --out "$out" ${BENCH_ARGS:---quick --layers 2 --budget-s 420} \
      > /dev/null 2>> "$out/models.log"
    s=$?; [[ $s == 0 ]] || rc=1
    note "bench: exit $s ($((SECONDS - t0)) s); results (RESULTS.md or matrix.md, .json, the plot) and models.log in $out"
    table="$out/RESULTS.md"; [[ -f "$out/matrix.md" ]] && table="$out/matrix.md"
    if [[ -f "$table" ]]; then cat "$table" >> "$out/summary.txt"; else tail -5 "$out/models.log" | tee -a "$out/summary.txt"; fi
    ;;
  *) note "unknown phase '$phase' (build, test, bench)"; rc=2 ;;
  esac
done
note "gpu_python.sh: exit $rc"
exit $rc
