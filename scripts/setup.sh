#!/usr/bin/env bash
# Installs every dependency ComFuse builds against, pinned, and is safe to re-run.
#   Debian -dev packages: CLI parser, JSON, hashing, formatting, logging, GoogleTest,
#   clang (libFuzzer for the text-format fuzz target).
#   CUTLASS/CuTe headers from the nvidia-cutlass wheel (PyPI), unpacked into
#   third_party/cutlass/include; the wheel's Python code is not used.
#   The Python package's test environment: build/pyvenv (scripts/setup_python.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

CUTLASS_WHEEL_VERSION="4.2.0.0"
CUTLASS_WHEEL_SHA256="f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6"

apt_pkgs=(
  "libcli11-dev=2.1.2+ds-1"
  "nlohmann-json3-dev=3.11.2-2"
  "libxxhash-dev=0.8.1-1"
  "libfmt-dev=9.1.0+ds1-2"
  "libspdlog-dev=1:1.10.0+ds-0.4"
  "libgtest-dev=1.12.1-0.2"
  "clang-14=1:14.0.6-12"
  "libclang-rt-14-dev=1:14.0.6-12"
  "unzip"
)

missing=()
for p in "${apt_pkgs[@]}"; do
  name="${p%%=*}"; want="${p#*=}"
  have="$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null || true)"
  if [[ "$have" != "install ok installed"* ]] || { [[ "$p" == *=* ]] && [[ "$have" != *" $want" ]]; }; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

dest="$root/third_party/cutlass"
stamp="$dest/VERSION"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$CUTLASS_WHEEL_VERSION" ]]; then
  echo "[setup] fetching CUTLASS headers (nvidia-cutlass==$CUTLASS_WHEEL_VERSION)"
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$CUTLASS_WHEEL_VERSION"
  whl="$(ls "$tmp"/nvidia_cutlass-*.whl)"
  echo "$CUTLASS_WHEEL_SHA256  $whl" | sha256sum -c --quiet -
  (cd "$tmp" && unzip -q "$whl" 'cutlass_library/source/include/*')
  rm -rf "$dest"; mkdir -p "$dest"
  mv "$tmp/cutlass_library/source/include" "$dest/include"
  echo "$CUTLASS_WHEEL_VERSION" > "$stamp"
fi
echo "[setup] dependencies ready (CUTLASS headers: $dest/include)"
bash "$root/scripts/setup_python.sh"
