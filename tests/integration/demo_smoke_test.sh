#!/usr/bin/env bash
# A small orbitkv-demo run (scripts/run.sh's program): dense engines and a hybrid engine with
# a model description against one Manager; every restored block and piece verified, the
# hybrid engine's plans restored a prefix, and its report says what recovery did not read
# (more than 0 bytes). Takes seconds; files under $TMPDIR (default /var/tmp).
# usage: demo_smoke_test.sh PATH/TO/orbitkv-demo PATH/TO/orbitkv-cache-manager
set -u
demo=${1:?usage: demo_smoke_test.sh DEMO MANAGER}
manager=${2:?usage: demo_smoke_test.sh DEMO MANAGER}
# shellcheck source=smoke_common.sh
source "$(dirname "$0")/smoke_common.sh"

"$demo" --engines 1 --hybrid-engines 1 --users 2 --rounds 3 --system-prompt-tokens 512 \
  --history-tokens 512 --compute-tokens-per-s 0 --no-progress --manager "$manager" \
  --state-dir "$work/state" >"$work/out.txt" 2>&1 && rc=0 || rc=$?
[[ $rc -eq 0 ]] && ok "demo exits 0" || { bad "demo exit $rc"; tail -30 "$work/out.txt"; }
grep -q "verification       OK: .* restored blocks and [1-9][0-9,]* hybrid pieces byte-exact" \
  "$work/out.txt" && ok "blocks and hybrid pieces verified" || bad "no verification of hybrid pieces"
grep -q "hybrid engines     6 requests" "$work/out.txt" && ok "the hybrid engine's 6 requests" \
  || bad "hybrid engine requests missing"
grep -qE "prefix restored  [1-9][0-9,]* of" "$work/out.txt" && ok "hybrid plans restored a prefix" \
  || bad "hybrid plans restored nothing"
line=$(grep "not needed  " "$work/out.txt")
[[ -n $line && $line != *"not needed       0 B"* ]] && ok "recovery skipped bytes: ${line#"${line%%[![:space:]]*}"}" \
  || bad "no bytes skipped by recovery ('$line')"
"$demo" --hybrid-engines 65 --manager "$manager" >/dev/null 2>&1 && rc=0 || rc=$?
[[ $rc -eq 2 ]] && ok "--hybrid-engines 65: exit 2" || bad "--hybrid-engines 65: exit $rc"

finish
