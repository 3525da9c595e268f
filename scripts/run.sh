#!/usr/bin/env bash
# The main job: builds OrbitKV if needed and runs orbitkv-demo, which starts
# orbitkv-cache-manager on embedded defaults sized to this machine (state,
# socket and SSD cache under ${XDG_CACHE_HOME:-$HOME/.cache}/orbitkv-demo or
# $ORBITKV_DEMO_DIR; /metrics on a free 127.0.0.1 port) and drives a
# multi-round conversation workload from engine processes on host pages, then
# prints hit rates, bytes by tier and restore throughput. Extra flags go to
# orbitkv-demo (see `scripts/run.sh --help`). Exit status: 0 ok, 1 a restored
# block had wrong bytes, 2 bad flags, 3 another failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh" >/dev/null
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
fi
cmake --build build -j "$(nproc)" --target orbitkv-cache-manager orbitkv-demo >/dev/null
exec build/src/demo/orbitkv-demo "$@"
