#!/bin/bash
# Manager process gates on the GPU host (cuFile compatibility mode: correctness,
# not GDS throughput): a CUDA engine process registers cudaMalloc pages by IPC
# handle, publishes, and restores from SSD; /metrics is scraped over HTTP.
# Usage on the GPU host: tests/gpu/process_gates.sh BUNDLE_DIR [all|tp|hybrid]
# (BUNDLE_DIR from gpu_host_tests.sh bundle, with enable-cufile-compat.sh
# copied in; logs go to $OUT or /tmp).
B=$(cd "${1:?usage: process_gates.sh BUNDLE_DIR [all|tp]}" && pwd)
shift
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT" || exit 1
export LD_LIBRARY_PATH=$B
D=/var/tmp/orbitkv
mkdir -p $D
bash $B/enable-cufile-compat.sh $D >/dev/null
export TMPDIR=$D CUFILE_ALLOW_COMPAT_MODE=true CUFILE_FORCE_COMPAT_MODE=true
scrape() { exec 3<>/dev/tcp/127.0.0.1/$1; printf "GET /metrics HTTP/1.0\r\n\r\n" >&3; cat <&3 | grep -E "cufile|fallbacks|orbitkv_bytes_total|staging_bytes|orbitkv_instances" | grep -v -E "_bucket|^#"; exec 3<&-; }
start() {  # name port binary args...
  local n=$1 port=$2 bin=$3; shift 3
  rm -f $D/$n.sock
  $bin --pool-size 1gb --ssd-cache-path $D/$n/cache.bin --ssd-cache-capacity 4gb --admission reuse \
    --socket $D/$n.sock --metrics-port $port "$@" > $OUT/$n.log 2>&1 &
  pid=$!
  for i in $(seq 100); do [[ -S $D/$n.sock ]] && break; sleep 0.1; done
}
failed=()
# check NAME STATUS: records a gate whose engine (or Manager) exited non-zero.
check() { echo "$1 exit $2"; [[ $2 == 0 ]] || failed+=("$1"); }
stop() { kill $pid; wait $pid; local rc=$?  # the Manager stops cleanly on SIGTERM: exit 0
  echo "manager exit $rc"; [[ $rc == 0 ]] || failed+=("manager:$1"); grep -E "SSD backend|fallback|worker|error|warn" $OUT/$1.log | cut -c1-300; }

if [[ ${1:-all} == all ]]; then
echo "########## A. --ssd-backend cufile: one CUDA engine, 64 blocks of 64 KiB"
start p1 19470 $B/orbitkv-cache-manager --ssd-backend cufile
$B/orbitkv-cuda-engine --socket $D/p1.sock --blocks 64; check "A engine" $?
scrape 19470; stop p1

echo "########## B. auto with one injected cuFile read failure (test-hooks Manager)"
ORBITKV_TEST_FAIL_CUFILE_READS=1 start p2 19471 $B/orbitkv-cache-manager-faults
$B/orbitkv-cuda-engine --socket $D/p2.sock --blocks 32 --retry-failed; check "B engine" $?
scrape 19471; stop p2

fi
if [[ ${1:-all} == all || ${1:-all} == hybrid ]]; then
echo "########## H1. hybrid model (attn + swa + gdn conv/SSM state), --ssd-backend cufile"
start h1 19474 $B/orbitkv-cache-manager --ssd-backend cufile
$B/orbitkv-cuda-engine --socket $D/h1.sock --hybrid --blocks 16; check "H1 engine" $?
scrape 19474; stop h1

echo "########## H2. hybrid model, --ssd-backend uring (io_uring -> pinned DRAM -> H2D)"
start h2 19475 $B/orbitkv-cache-manager --ssd-backend uring
$B/orbitkv-cuda-engine --socket $D/h2.sock --hybrid --blocks 16 --settle-ms 2000; check "H2 engine" $?
scrape 19475; stop h2

fi
if [[ ${1:-all} == all || ${1:-all} == tp ]]; then
echo "########## C. TP=2 group, ranks 0 and 1 as two engine processes (rank 1 on cuda:${RANK1_DEVICE:-0})"
start p3 19472 $B/orbitkv-cache-manager --ssd-backend cufile
$B/orbitkv-cuda-engine --socket $D/p3.sock --blocks 32 --ranks 2 --rank 0 --ns tp2 --settle-ms 2000 > $OUT/r0.log 2>&1 &
e0=$!
$B/orbitkv-cuda-engine --socket $D/p3.sock --blocks 32 --ranks 2 --rank 1 --device ${RANK1_DEVICE:-0} --ns tp2 --settle-ms 2000 > $OUT/r1.log 2>&1 &
e1=$!
wait $e0; check "rank 0" $?; wait $e1; check "rank 1" $?
cat $OUT/r0.log $OUT/r1.log
scrape 19472; stop p3
fi
if ((${#failed[@]})); then
  echo "process gates FAILED: ${failed[*]}"
  exit 1
fi
echo "process gates: all exits 0"
