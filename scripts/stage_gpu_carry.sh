#!/usr/bin/env bash
# Stages what the device machine needs into .carry/ (git-ignored): the GPU test binaries
# and the CLI from build/, stripped, plus the shared libraries that machine's image lacks.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
rm -rf "$root/.carry" && mkdir -p "$root/.carry/bin" "$root/.carry/lib"
for b in "$build"/test_gpu_* "$build/comfuse" "$build/channel_bench"; do
  [[ -x "$b" && "$b" != *.cmake ]] || continue
  strip -o "$root/.carry/bin/$(basename "$b")" "$b"
done
for l in libfmt.so.9 libspdlog.so.1.10 libxxhash.so.0; do cp -L "/lib/x86_64-linux-gnu/$l" "$root/.carry/lib/"; done
du -sh "$root/.carry"
