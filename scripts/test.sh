#!/usr/bin/env bash
# The test command (README quick start; .ci/run runs exactly this).
# Installs Debian packages if missing, builds once, runs every unit and
# integration test (GPU tests skip without a GPU), then the store and io tests
# under ASan+UBSan and TSan, and the clang-format check.
#   scripts/test.sh            everything
#   ORBITKV_SKIP_SANITIZERS=1  skip the two sanitizer builds (local iteration)
#   ORBITKV_SKIP_WHEEL=1       skip the wheel + fresh-venv Python package step
#   ORBITKV_SKIP_FUZZ=1        skip the libFuzzer runs and the clang thread-safety check;
#                              ORBITKV_FUZZ_SECONDS=N per target
#   ORBITKV_SKIP_VLLM=1        skip the vLLM connector tests (and making their venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
# ccache (scripts/setup.sh installs it; CMakeLists.txt uses it) shares objects between build dirs.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
"$root/scripts/setup.sh"

# /usr/bin/python3 is the interpreter Debian's python3-* packages serve.
PYTHON=/usr/bin/python3
export TMPDIR=${TMPDIR:-/var/tmp}

step() { printf '\n=== %s\n' "$*"; }

step "build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$PYTHON >/dev/null
cmake --build build -j "$jobs"

step "unit and integration tests"
ctest --test-dir build --output-on-failure -j "$jobs"

step "benches.gds (native GDS qualification script) source-level tests"
$PYTHON -m pytest -q -p no:cacheprovider benches/tests

if [[ ${ORBITKV_SKIP_WHEEL:-0} != 1 ]]; then
  # The orbitkv wheel (pyproject.toml) in a fresh venv from the python3 on
  # PATH, with pinned torch/transformers/numpy/pytest (cached venv, pip cache),
  # its tests against the installed package. Without CUDA: the main build
  # above compiled and tested the CUDA sources.
  step "Python package: wheel in a fresh virtual environment (scripts/py_env.sh)"
  ORBITKV_WHEEL_CMAKE_ARGS=${ORBITKV_WHEEL_CMAKE_ARGS:--Ccmake.define.ORBITKV_WITH_CUDA=OFF} \
    "$root/scripts/py_env.sh"
fi

# The vLLM connector in vLLM's real scheduler: the pinned vLLM venv (made once, cached), the
# orbitkv module built for its interpreter (build-vllm/), the Manager from build/.
if [[ ${ORBITKV_SKIP_VLLM:-0} != 1 ]]; then
  step "vLLM connector tests (tests/vllm, pinned vLLM venv, build-vllm/)"
  if vpy=$("$root/scripts/vllm_env.sh"); then
    cmake -S . -B build-vllm -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DORBITKV_WITH_CUDA=OFF \
      -DPython3_EXECUTABLE="$vpy" -Dpybind11_DIR="$("$vpy" -m pybind11 --cmakedir)" >/dev/null
    cmake --build build-vllm -j "$jobs" --target _orbitkv
    PYTHONPATH="$root/build-vllm/python" PYTHONDONTWRITEBYTECODE=1 \
      ORBITKV_MANAGER_BINARY="$root/build/src/server/orbitkv-cache-manager" \
      "$vpy" -m pytest -q -p no:cacheprovider tests/vllm
  else
    echo "SKIPPED: vLLM connector tests: the pinned vLLM environment could not be created (why: above)"
  fi
fi

if [[ ${ORBITKV_SKIP_SGLANG:-0} != 1 ]]; then
  step "SGLang adapter (tests/sglang, in the pinned SGLang venv; build-sglang/)"
  # scripts/sglang_env.sh creates the venv once (cached); the orbitkv module is
  # built for its interpreter. Only a venv that cannot be created skips, with why.
  if sglang_venv=$("$root/scripts/sglang_env.sh" | tail -1); then
    cmake -S . -B build-sglang -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DORBITKV_WITH_CUDA=OFF \
      -DPython3_EXECUTABLE="$sglang_venv/bin/python" \
      -Dpybind11_DIR="$("$sglang_venv/bin/python" -m pybind11 --cmakedir)" >/dev/null
    cmake --build build-sglang -j "$jobs" --target _orbitkv
    PYTHONPATH=build-sglang/python ORBITKV_MANAGER_BINARY=build/src/server/orbitkv-cache-manager \
      PYTHONDONTWRITEBYTECODE=1 "$sglang_venv/bin/python" -m pytest -q -p no:cacheprovider tests/sglang
  else
    echo "SKIPPED tests/sglang: scripts/sglang_env.sh could not create the SGLang venv (reason above)"
  fi
fi

if [[ ${ORBITKV_SKIP_SANITIZERS:-0} != 1 ]]; then
  sanitizer_tests=(common_test io_test catalog_test ssd_store_test dram_cache_test object_format_test manager_test protocol_test gpu_platform_fake_test gpu_tier_gate_test gpu_tier_two_device_test fault_matrix_test)
  for san in address thread; do
    step "store and io tests under ${san} sanitizer (build-${san}/)"
    cmake -S . -B "build-$san" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DORBITKV_SANITIZE=$san \
      -DORBITKV_WITH_CUDA=OFF -DORBITKV_BUILD_PYTHON=OFF >/dev/null
    cmake --build "build-$san" -j "$jobs" --target "${sanitizer_tests[@]}"
    regex=$(IFS='|'; echo "^(${sanitizer_tests[*]})\$")
    # ManagerCodecTest's reference CPU encoders run for minutes under TSan
    # (manager_test passed its 300 s timeout): the codec suite runs in the
    # plain and ASan builds; TSan skips it.
    filter='*'
    [[ $san == thread ]] && filter='-ManagerCodecTest.*'
    GTEST_FILTER=$filter UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 TSAN_OPTIONS=halt_on_error=1 \
      ctest --test-dir "build-$san" --output-on-failure -j "$jobs" -R "$regex"
  done
fi
if [[ ${ORBITKV_SKIP_FUZZ:-0} != 1 ]]; then
  fuzz_seconds=${ORBITKV_FUZZ_SECONDS:-20}
  step "parsers under libFuzzer, ${fuzz_seconds} s each (build-fuzz/, clang)"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DORBITKV_SANITIZE=fuzzer -DORBITKV_WITH_CUDA=OFF -DORBITKV_BUILD_PYTHON=OFF >/dev/null
  # The same clang build checks the lock annotations (GUARDED_BY/REQUIRES) of the
  # Manager and common code: -fsyntax-only -Werror=thread-safety, no code generation.
  $PYTHON scripts/thread_safety_check.py build-fuzz
  fuzzers=$(cd fuzz && ls *_fuzz.cc | sed 's/\.cc$//')
  # shellcheck disable=SC2086
  cmake --build build-fuzz -j "$jobs" --target $fuzzers
  for f in $fuzzers; do
    corpus=$(mktemp -d)
    [[ -d fuzz/corpus/$f ]] && cp fuzz/corpus/$f/* "$corpus"/ 2>/dev/null || true
    echo "--- $f"
    rc=0
    "build-fuzz/fuzz/$f" -max_total_time="$fuzz_seconds" -seed=1 -print_final_stats=1 "$corpus" \
      >"$corpus.log" 2>&1 || rc=$?
    grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done )" "$corpus.log" || true
    if [[ $rc -ne 0 ]]; then
      tail -40 "$corpus.log"
      echo "$f failed (exit $rc)"
      exit 1
    fi
    rm -rf "$corpus" "$corpus.log"
  done
fi
step "format check (clang-format, .clang-format)"
mapfile -t sources < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null || find src include -name '*.cc' -o -name '*.h')
if ((${#sources[@]})); then clang-format --dry-run -Werror "${sources[@]}"; fi

step "all tests passed"
