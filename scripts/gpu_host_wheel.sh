#!/usr/bin/env bash
# The orbitkv wheel for a host with no network and no OrbitKV build
# dependencies beyond a compiler, CMake, nvcc and a Python with pip,
# scikit-build-core and pybind11 (the project's H200: /opt/torch/.venv).
#
#   scripts/gpu_host_wheel.sh bundle DIR      here (Debian, scripts/setup.sh run):
#       DIR/src   the source tree (git-tracked and untracked-not-ignored files)
#       DIR/deps  what that host lacks, copied from Debian's packages with their
#                 /usr layout: liburing (headers, liburing.a, pkg-config file),
#                 FlatBuffers (headers, CMake package, flatc), CLI11 and
#                 nlohmann-json (headers, CMake packages), ISA-L (headers and
#                 libisal.so.2, which the wheel then carries), Nettle (headers
#                 and libnettle.a, linked statically: ORBITKV_STATIC_NETTLE)
#       DIR/gpu_host_wheel.sh (this script) and DIR/enable-cufile-compat.sh when
#       ../shared/gpu has it. Copy DIR to the host.
#   DIR/gpu_host_wheel.sh build DIR [PYTHON]  there: builds the wheel with PYTHON
#       (default python3) without build isolation or an index, into
#       DIR/wheelhouse, and installs it into PYTHON's environment. The wheel
#       links liburing statically and spdlog/fmt header-only (the host's
#       headers); it runs on any host with the same Python minor version.
#   pip install --no-index DIR/wheelhouse/orbitkv-*.whl   on further hosts.
#
# spdlog and fmt headers come from the building host (Ubuntu 24.04 has them);
# ORBITKV_CUDA_ARCHITECTURES (default 90) is passed as CMAKE_CUDA_ARCHITECTURES.
set -euo pipefail
cmd=${1:?usage: gpu_host_wheel.sh bundle DIR | build DIR [PYTHON]}
dir=${2:?usage: gpu_host_wheel.sh bundle DIR | build DIR [PYTHON]}

bundle() {
  local root
  root=$(cd "$(dirname "$0")/.." && pwd)
  rm -rf "$dir/src" "$dir/deps"
  mkdir -p "$dir/src" "$dir/deps"
  dir=$(cd "$dir" && pwd)
  (cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$dir/src")
  local pkgs=(liburing-dev liburing2 libflatbuffers-dev libflatbuffers2 flatbuffers-compiler
    libcli11-dev nlohmann-json3-dev libisal-dev libisal2 nettle-dev)
  local p f files=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      { echo "gpu_host_wheel: Debian package $p is missing (scripts/setup.sh)" >&2; exit 1; }
    while IFS= read -r f; do
      [[ $f == /usr/* && (-f $f || -L $f) && $f != /usr/share/doc/* && $f != /usr/share/man/* ]] &&
        files+=("${f#/}")
    done < <(dpkg -L "$p")
  done
  (cd / && printf '%s\0' "${files[@]}" | xargs -0 cp -a --parents -t "$dir/deps")
  sed -i "s|^prefix=.*|prefix=BUNDLE/usr|; s|^libdir=/usr|libdir=\${prefix}|; s|^includedir=/usr|includedir=\${prefix}|" \
    "$dir/deps/usr/lib/x86_64-linux-gnu/pkgconfig/liburing.pc"
  cp "$0" "$dir/gpu_host_wheel.sh"
  local compat=$root/../shared/gpu/enable-cufile-compat.sh
  [[ -f $compat ]] && cp "$compat" "$dir/"
  du -sh "$dir"
}

build() {
  local python=${3:-python3}
  dir=$(cd "$dir" && pwd)
  local deps=$dir/deps/usr
  # The pkg-config file names its prefix as BUNDLE; point it at this copy.
  sed -i "s|^prefix=.*|prefix=$deps|" "$deps/lib/x86_64-linux-gnu/pkgconfig/liburing.pc"
  export PKG_CONFIG_PATH=$deps/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  rm -rf "$dir/wheelhouse"
  "$python" -m pip wheel --no-build-isolation --no-index --no-deps -w "$dir/wheelhouse" \
    -Ccmake.define.CMAKE_PREFIX_PATH="$deps" \
    -Ccmake.define.ORBITKV_URING_ROOT="$deps" \
    -Ccmake.define.ORBITKV_FLATC="$deps/bin/flatc" \
    -Ccmake.define.CMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="${ORBITKV_CUDA_ARCHITECTURES:-90}" \
    -Cbuild-dir="$dir/build/{wheel_tag}" \
    "$dir/src"
  "$python" -m pip install --no-index --no-deps --force-reinstall "$dir"/wheelhouse/orbitkv-*.whl
  "$python" -c "import orbitkv; print('orbitkv', orbitkv.__version__, orbitkv.manager_binary())"
}

case $cmd in
  bundle) bundle ;;
  build) build "$@" ;;
  *)
    echo "usage: gpu_host_wheel.sh bundle DIR | build DIR [PYTHON]" >&2
    exit 2
    ;;
esac
