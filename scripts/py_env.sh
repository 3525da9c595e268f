#!/usr/bin/env bash
# The orbitkv Python package in a virtual environment: build the wheel, install
# it into a FRESH venv made from the `python3` on PATH, run its tests there.
#
#   scripts/py_env.sh            deps + wheel + test (what scripts/test.sh runs)
#   scripts/py_env.sh deps       the cached venv of pinned third-party packages
#                                (python/requirements-ci.txt: build backend,
#                                pybind11, numpy, pytest, torch, transformers);
#                                prints its path
#   scripts/py_env.sh wheel      builds the wheel with that venv's backend, no
#                                build isolation; prints its path
#   scripts/py_env.sh test [pytest args...]
#                                a new venv, the wheel installed with --no-index,
#                                the pinned packages visible through a .pth file,
#                                then pytest tests/python against the installed
#                                package (not the source tree)
#
# Caches (same machine, reused across runs), under $ORBITKV_PY_CACHE (default
# ${XDG_CACHE_HOME:-~/.cache}/orbitkv-py): the deps venv, one per hash of the
# requirements file and interpreter, and the downloaded wheels (wheels/); the
# CMake build tree of the wheel in build/py/ (incremental; ccache where
# installed). pip's own cache is left on.
# ORBITKV_WHEEL_CMAKE_ARGS adds -C settings to the wheel build (CI builds the
# wheel without CUDA: the CUDA sources are built and tested by the main build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PYTHON=${ORBITKV_VENV_PYTHON:-python3}
cache=${ORBITKV_PY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orbitkv-py}
requirements=$root/python/requirements-ci.txt
export TMPDIR=${TMPDIR:-/var/tmp}
mkdir -p "$cache"

log() { printf 'py_env: %s\n' "$*" >&2; }

deps_dir() {
  local key
  key=$({ "$PYTHON" -c 'import sys; print(sys.version)'; cat "$requirements"; } | sha256sum | cut -c1-16)
  echo "$cache/deps-$key"
}

cmd_deps() {
  local dir
  dir=$(deps_dir)
  if [[ -f $dir/.complete ]]; then
    echo "$dir"
    return
  fi
  rm -rf "$dir"
  log "creating $dir from $("$PYTHON" --version 2>&1) ($(command -v "$PYTHON"))"
  "$PYTHON" -m venv "$dir"
  # Wheels are kept in $cache/wheels (pip download skips those already there):
  # pip's HTTP cache is not reliable behind every proxy, and torch's are big.
  "$dir/bin/python" -m pip download -q --disable-pip-version-check -d "$cache/wheels" \
    -r "$requirements" >&2
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-index \
    --find-links "$cache/wheels" -r "$requirements" >&2
  touch "$dir/.complete"
  echo "$dir"
}

cmd_wheel() {
  local deps out
  deps=$(cmd_deps)
  out=$root/build/py/wheelhouse
  rm -rf "$out"
  mkdir -p "$out"
  local -a extra=()
  # shellcheck disable=SC2206
  [[ -n ${ORBITKV_WHEEL_CMAKE_ARGS:-} ]] && extra=(${ORBITKV_WHEEL_CMAKE_ARGS})
  log "building the wheel (build/py/, ${extra[*]:-default settings})"
  CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} "$deps/bin/python" -m pip wheel -q \
    --disable-pip-version-check --no-build-isolation --no-deps -w "$out" "${extra[@]}" . >&2
  ls "$out"/orbitkv-*.whl
}

cmd_test() {
  local deps wheel site deps_site
  deps=$(cmd_deps)
  wheel=$(ls "$root"/build/py/wheelhouse/orbitkv-*.whl 2>/dev/null | head -1 || true)
  [[ -n $wheel ]] || wheel=$(cmd_wheel)
  venv=$(mktemp -d "$TMPDIR/orbitkv-venv-XXXXXX")  # global: the EXIT trap removes it
  trap 'rm -rf "$venv"' EXIT
  "$PYTHON" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  deps_site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$deps_site')" >"$site/orbitkv-ci-deps.pth"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$wheel"
  # The console script runs the Manager bundled in the wheel.
  "$venv/bin/orbitkv-cache-manager" --help >/dev/null
  echo "console script orbitkv-cache-manager --help: ok"
  (
    cd "$TMPDIR"
    "$venv/bin/python" - <<'EOF'
import os, sys
import orbitkv
assert "torch" not in sys.modules, "import orbitkv imported torch"
assert os.path.realpath(orbitkv.__file__).startswith(os.path.realpath(sys.prefix)), orbitkv.__file__
print("orbitkv", orbitkv.__version__, "from", os.path.dirname(orbitkv.__file__))
print("manager", orbitkv.manager_binary())
EOF
  )
  env -u ORBITKV_MANAGER_BINARY PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider --rootdir "$root/tests/python" "$root/tests/python" "$@"
}

case ${1:-all} in
  deps) cmd_deps ;;
  wheel) cmd_wheel ;;
  test)
    shift
    cmd_test "$@"
    ;;
  all)
    cmd_wheel >/dev/null
    cmd_test
    ;;
  *)
    echo "usage: $0 [all|deps|wheel|test [pytest args]]" >&2
    exit 2
    ;;
esac
