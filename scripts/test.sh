#!/usr/bin/env bash
# The test command (README quick start; .ci/run runs exactly this).
# Installs Debian packages if missing, builds once, runs every unit and
# integration test (GPU tests skip without a GPU), then the store and io tests
# under ASan+UBSan and TSan, and the clang-format check.
#   scripts/test.sh            everything
#   ORBITKV_SKIP_SANITIZERS=1  skip the two sanitizer builds (local iteration)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
"$root/scripts/setup.sh"

# /usr/bin/python3 is the interpreter Debian's python3-* packages serve.
PYTHON=/usr/bin/python3
export TMPDIR=${TMPDIR:-/var/tmp}

step() { printf '\n=== %s\n' "$*"; }

step "format check (clang-format, .clang-format)"
mapfile -t sources < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null || find src include -name '*.cc' -o -name '*.h')
if ((${#sources[@]})); then clang-format --dry-run -Werror "${sources[@]}"; fi

step "build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$PYTHON >/dev/null
cmake --build build -j "$jobs"

step "unit and integration tests"
ctest --test-dir build --output-on-failure -j "$jobs"

if [[ ${ORBITKV_SKIP_SANITIZERS:-0} != 1 ]]; then
  sanitizer_tests=(common_test io_test catalog_test ssd_store_test)
  for san in address thread; do
    step "store and io tests under ${san} sanitizer (build-${san}/)"
    cmake -S . -B "build-$san" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DORBITKV_SANITIZE=$san \
      -DORBITKV_WITH_CUDA=OFF -DORBITKV_BUILD_PYTHON=OFF >/dev/null
    cmake --build "build-$san" -j "$jobs" --target "${sanitizer_tests[@]}"
    regex=$(IFS='|'; echo "^(${sanitizer_tests[*]})\$")
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TSAN_OPTIONS=halt_on_error=1 \
      ctest --test-dir "build-$san" --output-on-failure -j "$jobs" -R "$regex"
  done
fi
step "all tests passed"
