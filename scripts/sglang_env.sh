#!/usr/bin/env bash
# Creates (once) the pinned SGLang virtual environment the SGLang adapter's tests
# run in, and prints its directory on the last line of stdout.
#
#   scripts/sglang_env.sh            create or reuse; prints e.g. ~/.cache/orbitkv/venvs/sglang-0.5.23
#   ORBITKV_VENV_DIR=DIR             where the venvs live (default ~/.cache/orbitkv/venvs)
#   ORBITKV_SGLANG_PYTHON=PY         base interpreter (default: python3 on PATH; must be 3.11,
#                                    the wheel is cp311)
#
# Every package is pinned in tests/sglang/requirements.txt and installed with
# --no-deps, so nothing is resolved and the set is exactly the file. The venv is
# stamped with the file's sha256: a second run with the same file does nothing,
# a changed file rebuilds it, so the wheels (about 4 GB: torch and its CUDA
# libraries; the venv is 5.5 GB) are downloaded once per requirements file.
# pip's download cache goes beside the venvs ($ORBITKV_VENV_DIR/pip-cache
# unless PIP_CACHE_DIR is set) where pip keeps one.
# Exit status: 0 ready, 1 the environment cannot be created (the reason on stderr).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/tests/sglang/requirements.txt"
version=$(sed -n 's/^sglang==//p' "$req")
base_python=${ORBITKV_SGLANG_PYTHON:-python3}
venv_root=${ORBITKV_VENV_DIR:-$HOME/.cache/orbitkv/venvs}
venv="$venv_root/sglang-$version"
stamp="$venv/.orbitkv-requirements.sha256"
want=$(sha256sum "$req" | cut -d' ' -f1)

fail() {
  echo "sglang_env: $*" >&2
  exit 1
}

if [[ -f $stamp && $(cat "$stamp") == "$want" && -x $venv/bin/python ]]; then
  echo "$venv"
  exit 0
fi

command -v "$base_python" >/dev/null || fail "no $base_python on PATH"
pyver=$("$base_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $pyver == 3.11 ]] || fail "$base_python is Python $pyver; sglang $version's wheel needs 3.11"
"$base_python" -c 'import venv, ensurepip' 2>/dev/null ||
  fail "$base_python lacks venv/ensurepip (Debian: apt-get install python3-venv)"

mkdir -p "$venv_root"
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$venv_root/pip-cache}
# The stamp is written last: a run that stopped half way leaves no stamp, and
# the next run starts the venv over.
rm -rf "$venv"
echo "sglang_env: creating $venv (sglang $version, pinned in $req)" >&2
"$base_python" -m venv "$venv" || fail "python -m venv failed"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
  --no-warn-script-location -r "$req" >&2 || fail "pip install -r $req failed"
"$venv/bin/python" -c "
import importlib.metadata as md
import sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.storage.backend_factory
import sglang.srt.mem_cache.memory_pool_host, sglang.srt.mem_cache.pool_host.mha
assert md.version('sglang') == '$version', md.version('sglang')
" 2>/dev/null || fail "the new venv cannot import sglang's storage and host pool modules"
echo "$want" >"$stamp"
echo "$venv"
