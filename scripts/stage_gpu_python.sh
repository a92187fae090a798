#!/usr/bin/env bash
# Stages, here, what building the Python package on the GPU machine needs and that machine's
# image lacks: the Debian -dev packages the core compiles against (fmt, spdlog, nlohmann-json,
# xxHash; CLI11 and GoogleTest are not needed: the package builds no CLI and no tests) and their
# shared libraries, unpacked with `dpkg -x` into .pycarry/prefix (git-ignored, ~5 MB; found
# there through CMAKE_PREFIX_PATH by scripts/gpu_python.sh). The same pinned versions as
# scripts/setup.sh. Carry .pycarry and third_party/cutlass to the GPU machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.pycarry"
debs=(
  "libfmt-dev=9.1.0+ds1-2" "libfmt9=9.1.0+ds1-2"
  "libspdlog-dev=1:1.10.0+ds-0.4" "libspdlog1.10=1:1.10.0+ds-0.4"
  "nlohmann-json3-dev=3.11.2-2"
  "libxxhash-dev=0.8.1-1" "libxxhash0=0.8.1-1"
)
rm -rf "$dest" && mkdir -p "$dest/debs" "$dest/prefix"
if ! (cd "$dest/debs" && apt-get download "${debs[@]}" >/dev/null 2>&1); then
  apt-get update -qq
  (cd "$dest/debs" && apt-get download "${debs[@]}")
fi
for d in "$dest"/debs/*.deb; do dpkg -x "$d" "$dest/prefix"; done
rm -rf "$dest/debs" "$dest/prefix/usr/share/doc"
[[ -e "$root/third_party/cutlass/include/cute/tensor.hpp" ]] || bash "$root/scripts/setup.sh"
echo "[stage] .pycarry: $(du -sh "$dest" | cut -f1); third_party/cutlass: $(du -shL "$root/third_party/cutlass" | cut -f1)"
echo "[stage] on the GPU machine, carrying .pycarry and third_party/cutlass: bash scripts/gpu_python.sh"
