# Sourced by the smoke tests (bench_smoke_test.sh, demo_smoke_test.sh): $work, a fresh
# directory under $TMPDIR (default /var/tmp) removed on exit; ok/bad count the checks;
# finish prints the counts and fails when a check did.
work=$(mktemp -d "${TMPDIR:-/var/tmp}/orbitkv-smoke-XXXXXX")
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
bad() { echo "FAIL: $1"; failed=$((failed + 1)); }
finish() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}
