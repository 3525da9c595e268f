# bench_one.sh: sourced by h200_perf.sh and host_perf.sh. Defines
#   one NAME ARGS...
# which runs "${bench[@]}" ARGS --json "$out/NAME.json", keeps its summary in
# "$out/NAME.txt" (and on stdout), and sets rc to the first failing run's
# exit status. The caller sets bench (an array), out and rc=0.
one() {
  local name=$1
  shift
  echo "=== $name: orbitkv-bench $*"
  local t0=$SECONDS
  "${bench[@]}" "$@" --json "$out/$name.json" 2>&1 | tee "$out/$name.txt"
  local st=${PIPESTATUS[0]}
  echo "=== $name: exit $st in $((SECONDS - t0)) s"
  ((rc == 0 && st != 0)) && rc=$st
}
