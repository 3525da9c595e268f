#!/bin/bash
# host_perf.sh: issue 18's benchmark on a host without a GPU (the project's
# 2-vCPU VM), the counterpart of h200_perf.sh: every orbitkv-bench workload
# that runs on host pages, each next to the ceilings measured in the same run
# (fio where installed, else the bench's io_uring probe; memcpy).
#
#   scripts/host_perf.sh BUILD_DIR OUT_DIR [SSD_DIR]
#
# BUILD_DIR holds a build of orbitkv-bench and orbitkv-cache-manager
# (README "Benchmark"). Runs, with 16-token blocks of llama-3.1-8b unless
# named: block-size-sweep at 16 tokens (dram, ssd-uring, naive: DRAM -> host
# pages and the naive baseline), publish-only (dram), restore-only (the SSD
# serves: ssd-uring against naive and the disk ceiling), multi-round-qa (all
# routes), the hybrid qwen3-next-hybrid's multi-round-qa (recovery plans),
# query-scale and scale (tiny model, 1M objects, 1..4 engines on 2 cores).
# Summaries go to stdout and OUT_DIR/*.txt, reports to OUT_DIR/*.json. Exit
# status: the first failing run's (1: wrong bytes), else 0.
set -uo pipefail
build=${1:?usage: host_perf.sh BUILD_DIR OUT_DIR [SSD_DIR]}
out=${2:?usage: host_perf.sh BUILD_DIR OUT_DIR [SSD_DIR]}
ssd=${3:-/var/tmp/orbitkv-host-perf}
mkdir -p "$out" "$ssd" || exit 1
bench=("$build/src/bench/orbitkv-bench" --manager "$build/src/server/orbitkv-cache-manager"
  --ssd-dir "$ssd" --no-progress)
for b in "${bench[0]}" "${bench[2]}"; do
  [[ -x $b ]] || { echo "host_perf.sh: $b is not built" >&2; exit 2; }
done
rc=0
# shellcheck source=bench_one.sh
source "$(dirname "$0")/bench_one.sh"  # one NAME ARGS...
echo "=== host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
one sweep16 --workload block-size-sweep --sweep-block-tokens 16 --working-set 1gib \
  --routes dram,ssd-uring,naive
one publish --workload publish-only --working-set 1gib --routes dram
one restore-only --workload restore-only --pool-size 1gib --routes ssd-uring,naive
one multi-round-qa --workload multi-round-qa
one hybrid-mrqa --workload multi-round-qa --model qwen3-next-hybrid --engines 2 --users 2 \
  --rounds 3 --routes dram,ssd-uring
one query-scale --workload query-scale --model tiny
one scale --workload scale --model tiny --scale-objects 1000000 --scale-engines 4
echo "=== host_perf.sh: exit $rc"
exit $rc
