#!/usr/bin/env bash
# The main job: builds OrbitKV if needed and starts orbitkv-cache-manager on
# embedded defaults: a 1gb pool and a 4gb SSD cache under build/demo-cache,
# /metrics on 127.0.0.1:9464. Stop it with Ctrl-C. Extra flags are passed on.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh" >/dev/null
if [[ ! -x build/src/server/orbitkv-cache-manager ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
fi
cmake --build build -j "$(nproc)" --target orbitkv-cache-manager >/dev/null
exec build/src/server/orbitkv-cache-manager --pool-size 1gb \
  --ssd-cache-path "$root/build/demo-cache/cache.bin" --ssd-cache-capacity 4gb "$@"
