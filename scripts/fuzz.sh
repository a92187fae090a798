#!/usr/bin/env bash
# Fuzzes the graph and spec text parsers with libFuzzer + ASan + UBSan.
#   scripts/fuzz.sh [SECONDS]   (default 30 per target); exits non-zero on any crash.
# Builds into build-fuzz/ straight from the sources (no CMake: the fuzz targets need
# only the graph, text and spec layers, compiled with clang's sanitizers).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${1:-30}"
out="$root/build-fuzz"
mkdir -p "$out"
cxx="${CXX_FUZZ:-clang++}"
flags=(-std=c++20 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -O1 -g -I "$root/include")
lib_srcs=("$root"/src/graph/*.cpp "$root"/src/text/*.cpp "$root"/src/spec/*.cpp)

# Compile the library sources once (without the fuzzer main), then link each target.
objs=()
for src in "${lib_srcs[@]}"; do
  obj="$out/$(basename "$(dirname "$src")")_$(basename "${src%.cpp}").o"
  if [[ ! -f "$obj" || "$src" -nt "$obj" || -n "$(find "$root/include" -newer "$obj" -print -quit)" ]]; then
    echo "[fuzz] compiling $src"
    "$cxx" "${flags[@]/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}" -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done

status=0
for target in fuzz_graph_text fuzz_spec_text; do
  echo "[fuzz] building $target"
  "$cxx" "${flags[@]}" "$root/tests/fuzz/$target.cpp" "${objs[@]}" -lfmt -o "$out/$target"
  corpus="$out/corpus_$target"
  mkdir -p "$corpus"
  if [[ $target == fuzz_graph_text ]]; then
    cp "$root"/examples/*.cf "$corpus"/ 2>/dev/null || true
  else
    # Seed with the printed specs of the examples where the CLI can produce them,
    # and always with a small hand-written spec.
    cat > "$corpus/seed_minimal.spec" <<'SPEC'
fusion f (b_layout=nk, m=M, n=N, k=K) {
  args {
    a0: operand_a x bf16[M, K]
    a1: operand_b w bf16[N, K]
    a2: row_vector b bf16[N]
    a3: output y bf16[M, N] tile
  }
  stage {
    n0: tile = acc
    n1: row = bcast.row a2
    n2: tile = add n0, n1 origin="%binary3"
    n3: col = reduce.max n2 -> post 0
    terminal n3
    post 0: stage {
      n0: col = stat
      n1: tile = bypass from n2
      n2: tile = sub n1, n0
      n3: scalar = bcast.scalar -1.5e-05
      n4: tile = pow n2, n3
      n5: tile = store n4 -> a3
      terminal n5
    }
  }
}
SPEC
    if [[ -x "$root/build/comfuse" ]]; then
      for f in "$root"/examples/*.cf; do
        "$root/build/comfuse" lower "$f" > "$corpus/$(basename "${f%.cf}").spec" 2>/dev/null || rm -f "$corpus/$(basename "${f%.cf}").spec"
      done
    fi
  fi
  echo "[fuzz] running $target for ${secs}s"
  if ! (cd "$out" && "./$target" "$corpus" -max_len=4096 -timeout=5 -max_total_time="$secs" \
          -print_final_stats=1 -artifact_prefix="$out/${target}_"); then
    echo "[fuzz] $target FAILED (artifacts: $out/${target}_*)" >&2
    status=1
  fi
done
exit $status
