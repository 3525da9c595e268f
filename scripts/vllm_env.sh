#!/usr/bin/env bash
# Creates (once) the pinned vLLM virtual environment of the OrbitKV vLLM connector
# and prints its interpreter's path on stdout (progress goes to stderr).
#
#   py=$(scripts/vllm_env.sh) && "$py" -m pytest tests/vllm
#
# The venv is made from the python3 on PATH (3.10..3.13) at
# ${ORBITKV_VENV_DIR:-${XDG_CACHE_HOME:-~/.cache}/orbitkv/venvs}/vllm-<version> and filled with
# exactly tests/vllm/requirements.txt (every package pinned; vLLM's PyPI wheel brings its CUDA
# torch, which imports on machines without a GPU). pip's cache stays in
# $PIP_CACHE_DIR (default <venvs>/pip-cache), so a re-creation downloads nothing twice. When the
# venv already holds these requirements (a stamp of the file's SHA-256) the script only prints
# the path. Concurrent runs serialise on a lock. Exit status 3: the environment cannot be
# created here; the reason is on stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req=$root/tests/vllm/requirements.txt
version=$(sed -n 's/^vllm==//p' "$req")
[[ -n $version ]] || { echo "vllm_env: no vllm== pin in $req" >&2; exit 3; }
base=${ORBITKV_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/orbitkv/venvs}
venv=$base/vllm-$version
stamp=$venv/.orbitkv-requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)

ready() { [[ -x $venv/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; }
if ready; then
  echo "$venv/bin/python"
  exit 0
fi

fail() { echo "vllm_env: $*" >&2; exit 3; }
python=$(command -v python3) || fail "no python3 on PATH"
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case $pyver in
  3.10 | 3.11 | 3.12 | 3.13) ;;
  *) fail "python3 on PATH is $pyver; vLLM $version needs 3.10..3.13" ;;
esac
"$python" -c 'import venv, ensurepip' 2>/dev/null || fail "$python lacks venv/ensurepip (Debian: apt-get install python3-venv)"

mkdir -p "$base"
exec 9>"$base/.vllm-$version.lock"
flock 9
if ready; then
  echo "$venv/bin/python"
  exit 0
fi
export PIP_CACHE_DIR=${PIP_CACHE_DIR:-$base/pip-cache}
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "vllm_env: creating $venv from $python ($pyver), pinned by $req" >&2
start=$(date +%s)
if [[ ! -x $venv/bin/python ]]; then
  "$python" -m venv "$venv" >&2 || fail "python3 -m venv $venv failed"
fi
rm -f "$stamp"
# A half-made venv (an interrupted run) is completed here: pip skips what is installed.
"$venv/bin/python" -m pip install --quiet --requirement "$req" >&2 ||
  fail "pip install -r $req failed (PyPI unreachable or a pin without a wheel for Python $pyver)"
"$venv/bin/python" -c 'import vllm, torch, pytest, pybind11' >&2 ||
  fail "the new environment cannot import vllm/torch/pytest/pybind11"
echo "$want" >"$stamp"
echo "vllm_env: ready after $(($(date +%s) - start)) s: $venv" >&2
echo "$venv/bin/python"
