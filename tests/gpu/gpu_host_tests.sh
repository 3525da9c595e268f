#!/bin/bash
# gpu_host_tests.sh: run the GPU tier's tests on a CUDA host from binaries
# built elsewhere (the host lacks this project's build dependencies).
#
#   On the build machine:
#     tests/gpu/gpu_host_tests.sh bundle BUILD_DIR OUT_DIR
#   copies the gpu test executables, the fake libcufile variants and the shared
#   libraries they need that a bare CUDA host may lack (spdlog, fmt, ISA-L's
#   libisal) into OUT_DIR.
#
#   On the GPU host, from the repository root:
#     tests/gpu/gpu_host_tests.sh run OUT_DIR
#   compiles and runs cufile_header_check against /usr/local/cuda/include/cufile.h
#   (needs only g++ and the CUDA headers), then runs gpu_device_test,
#   cufile_loader_test, cufile_native_policy_test, cufile_smoke_test,
#   cuda_platform_test, crc32c_kernel_test (the GPU CRC32C against ISA-L),
#   gpu_tier_gate_cuda_test (the GPU storage tier's gates) and codec_cuda_test
#   (GPU codec decoders against the CPU's, decode GB/s).
#   The smoke test uses the caller's cuFile environment; for functional
#   (compatibility-mode) runs set CUFILE_ALLOW_COMPAT_MODE=true,
#   CUFILE_FORCE_COMPAT_MODE=true and TMPDIR to a directory where cuFile can
#   register files. Such results establish compatibility-mode correctness,
#   not native GPUDirect Storage. ORBITKV_GPU_TEST_REQUIRE_CUFILE=1 makes
#   cuFile capability refusals fail instead of skip.
set -uo pipefail

tests=(gpu_device_test cufile_loader_test cufile_native_policy_test cufile_smoke_test
  cuda_platform_test host_copy_modes_test crc32c_kernel_test gpu_tier_gate_cuda_test
  codec_cuda_test)

case "${1:-}" in
  bundle)
    build=${2:?usage: gpu_host_tests.sh bundle BUILD_DIR OUT_DIR}
    out=${3:?usage: gpu_host_tests.sh bundle BUILD_DIR OUT_DIR}
    src="$build/src/gpu/tests"
    mkdir -p "$out" || exit 1
    for t in "${tests[@]}"; do
      f="$src/$t"
      [[ -f $f ]] || f="$build/tests/gpu_tier/$t"
      [[ -f $f ]] || f="$build/src/codec/$t"
      cp "$f" "$out/" && strip "$out/$t" || exit 1
    done
    cp "$src"/liborbitkv_fake_cufile_*.so "$out/" || exit 1
    # Process gates (process_gates.sh): the Manager, its test-hooks twin and
    # a CUDA engine process.
    for b in "$build/src/server/orbitkv-cache-manager" \
             "$build/src/server/orbitkv-cache-manager-faults" "$src/orbitkv-cuda-engine"; do
      cp "$b" "$out/" && strip "$out/$(basename "$b")" || exit 1
    done
    # Shared libraries outside glibc/libstdc++ that the executables load.
    ldd "$src/gpu_device_test" "$build/tests/gpu_tier/gpu_tier_gate_cuda_test" "$out/orbitkv-cache-manager" \
      "$build/src/codec/codec_cuda_test" | awk '/=> \// {print $3}' | sort -u |
      grep -E 'lib(spdlog|fmt|isal|nettle)\.so' | while read -r lib; do cp -L "$lib" "$out/"; done
    ls -l "$out"
    ;;
  run)
    dir=$(cd "${2:?usage: gpu_host_tests.sh run BUNDLE_DIR}" && pwd) || exit 1
    root=$(cd "$(dirname "$0")/../.." && pwd)
    export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    echo "cuFile environment: CUFILE_ALLOW_COMPAT_MODE=${CUFILE_ALLOW_COMPAT_MODE-unset}" \
      "CUFILE_FORCE_COMPAT_MODE=${CUFILE_FORCE_COMPAT_MODE-unset} TMPDIR=${TMPDIR-unset}"
    failed=()
    cufile_h=${CUDA_HOME:-/usr/local/cuda}/include/cufile.h
    if [[ -f $cufile_h ]]; then
      echo "=== cufile_header_check ($cufile_h)"
      # Built in a scratch directory: the bundle may be read-only.
      scratch=$(mktemp -d)
      if g++ -std=c++20 -Wall -I"$root/src" -I"$(dirname "$cufile_h")" \
          "$root/tests/gpu/cufile_header_check.cc" -o "$scratch/cufile_header_check" &&
        "$scratch/cufile_header_check"; then :; else failed+=(cufile_header_check); fi
      rm -rf "$scratch"
    else
      echo "=== cufile_header_check SKIPPED: no $cufile_h"
    fi
    for t in "${tests[@]}"; do
      echo "=== $t"
      "$dir/$t" || failed+=("$t")
    done
    if ((${#failed[@]})); then
      echo "FAILED: ${failed[*]}"
      exit 1
    fi
    echo "all GPU tier tests passed (skips are listed in each test's output)"
    ;;
  *)
    echo "usage: gpu_host_tests.sh bundle BUILD_DIR OUT_DIR | run BUNDLE_DIR" >&2
    exit 2
    ;;
esac
