#!/usr/bin/env bash
# Installs the Debian packages OrbitKV builds and tests with. Idempotent: a
# package already installed is left alone, and apt runs only when one is missing.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config clang clang-format libclang-rt-14-dev ccache
  libisal-dev                     # CRC32C of object payloads (ISA-L, memory speed)
  nettle-dev                      # SHA-256 of model descriptions (src/recovery)
  liburing-dev                    # io_uring engine
  libgtest-dev libgmock-dev       # unit tests
  libbenchmark-dev                # micro-benchmarks
  libcli11-dev                    # flags
  zlib1g-dev                      # crc32 of headers
  libspdlog-dev libfmt-dev        # logs
  nlohmann-json3-dev              # configs, reports
  libflatbuffers-dev flatbuffers-compiler  # engine protocol schema + verifier
  pybind11-dev python3-pybind11 python3-dev python3-pytest python3-numpy  # Python module
  fio                             # disk ceiling in benchmarks
  python3-matplotlib              # orbitkv-bench --png (scripts/bench_plot.py)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
