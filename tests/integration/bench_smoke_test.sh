#!/usr/bin/env bash
# A tiny orbitkv-bench run on every host-page route, checked through its JSON:
# verification passed, every route ran and restored bytes, every ceiling is
# measured or n/a with a reason, the targets are reported; then fio missing
# (the bench's io_uring probe measures the disk; with --disk-ceiling fio: n/a,
# not a failure), a wrong byte (exit 1), a CUDA device where there is none
# (exit 2), the scale workload's figures, storage codecs (their JSON fields, and
# encoded DRAM copies against raw ones in one run), and a hybrid model
# registered with its description (the plans skip what recovery does not need).
# Takes seconds; files under $TMPDIR (default /var/tmp).
# usage: bench_smoke_test.sh PATH/TO/orbitkv-bench PATH/TO/orbitkv-cache-manager
set -u
bench=${1:?usage: bench_smoke_test.sh BENCH MANAGER}
manager=${2:?usage: bench_smoke_test.sh BENCH MANAGER}
# shellcheck source=smoke_common.sh
source "$(dirname "$0")/smoke_common.sh"
tiny=(--model tiny --engines 2 --users 2 --rounds 2 --system-prompt-tokens 256
      --history-tokens 256 --question-tokens 32 --answer-tokens 32 --latency-probes 8
      --ceiling-seconds 0.3 --fio-file-size 16mib --manager "$manager" --no-progress)

# 1. multi-round-qa on dram, ssd-uring and naive.
"$bench" --workload multi-round-qa "${tiny[@]}" --ssd-dir "$work/run" --json "$work/report.json" \
  --png "$work/report.png" >"$work/out.txt" 2>&1 && rc=0 || rc=$?
[[ $rc -eq 0 ]] && ok "multi-round-qa exits 0" || { bad "multi-round-qa exit $rc"; tail -30 "$work/out.txt"; }
check=$(/usr/bin/python3 - "$work/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
errors = []
v = r["verification"]
if not (v["enabled"] and v["passed"] and v["verified_blocks"] > 0 and v["mismatched_blocks"] == 0):
    errors.append(f"verification {v}")
p = r["points"][0]
routes = {x["route"]: x for x in p["routes"]}
for name in ("dram", "ssd-uring", "naive"):
    x = routes.get(name)
    if not x or x["status"] != "ok":
        errors.append(f"route {name} missing or not ok")
    elif x["hits"]["dram"] + x["hits"]["ssd"] <= 0 or not x["verification"]["ok"]:
        errors.append(f"route {name} restored nothing or failed verification")
    elif name != "ssd-uring" and x["restore"]["bytes"] <= 0:
        # ssd-uring may serve a chat from DRAM when a query pins an object before
        # its writeback; restore-only below waits for writeback and checks it.
        errors.append(f"route {name} served no restore through its own tier")
for name, c in p["ceilings"].items():
    if name in ("memcpy_threads", "disk_tool"):
        continue
    if c["status"] == "ok":
        if not c["gbps"] > 0:
            errors.append(f"ceiling {name} ok without GB/s")
    elif c["status"] != "n/a" or not c["reason"]:
        errors.append(f"ceiling {name} neither measured nor n/a with a reason")
if p["ceilings"]["memcpy_multi"]["status"] != "ok":
    errors.append("memcpy ceiling not measured")
if p["ceilings"]["disk_tool"] not in ("fio", "probe"):
    errors.append("disk_tool neither fio nor probe")
if len(r["targets"]) != 5:
    errors.append("targets missing")
print("; ".join(errors) if errors else "OK")
PY
)
[[ $check == OK ]] && ok "JSON: verification passed, routes present, ceilings measured or n/a" \
  || bad "JSON: $check"
grep -q "verification       OK" "$work/out.txt" && ok "summary says verification OK" \
  || bad "summary lacks the verification line"
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  [[ -s $work/report.png ]] && ok "PNG written" || bad "no PNG although matplotlib is there"
else
  grep -q "plot .*skipped" "$work/out.txt" && ok "PNG skipped without matplotlib" \
    || bad "no word about the skipped PNG"
fi

# 2. restore-only: the SSD serves both SSD routes; without fio the bench measures the
#    disk ceiling itself (its io_uring probe) and says so.
"$bench" --workload restore-only "${tiny[@]}" --routes ssd-uring,naive --working-set 4mib \
  --pool-size 16mib --fio /nonexistent/fio --ssd-dir "$work/nofio" --json "$work/nofio.json" \
  >"$work/nofio.txt" 2>&1 && rc=0 || rc=$?
probe=$(/usr/bin/python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["points"][0]["ceilings"]
print(c["disk_tool"], c["fio_read"]["status"], c["fio_write"]["status"],
      "io_uring probe" in c["fio_read"]["what"])' "$work/nofio.json" 2>/dev/null)
[[ $rc -eq 0 && $probe == "probe ok ok True" ]] && ok "fio missing: the io_uring probe measured" \
  || { bad "fio missing (rc $rc, '$probe')"; tail -20 "$work/nofio.txt"; }
grep -q "probe read" "$work/nofio.txt" && ok "summary names the probe ceiling" \
  || bad "summary does not name the probe ceiling"
ssd=$(/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
routes = {x["route"]: x for x in r["points"][0]["routes"]}
print(all(routes[n]["restore"]["bytes"] > 0 and routes[n]["hits"]["dram"] == 0 for n in ("ssd-uring", "naive"))
      and r["verification"]["passed"])' "$work/nofio.json" 2>/dev/null)
[[ $ssd == True ]] && ok "restore-only: ssd-uring and naive restore from SSD, verified" \
  || bad "restore-only SSD restores ($ssd)"

# 3. A wrong byte fails the run: exit 1, the JSON says verification failed.
"$bench" --workload restore-only "${tiny[@]}" --routes naive --working-set 4mib --pool-size 16mib \
  --disk-ceiling fio --fio /nonexistent/fio --inject-corruption 7 --ssd-dir "$work/bad" \
  --json "$work/bad.json" >"$work/bad.txt" 2>&1 && rc=0 || rc=$?
passed_flag=$(/usr/bin/python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))["verification"]; print(v["passed"], v["mismatched_blocks"] > 0)' "$work/bad.json" 2>/dev/null)
[[ $rc -eq 1 && $passed_flag == "False True" ]] && grep -q "verification       FAILED" "$work/bad.txt" \
  && ok "corrupted restores: exit 1, verification FAILED" || bad "corruption (rc $rc, $passed_flag)"
# ... and --disk-ceiling fio without fio: n/a with the reason, not a failure of the run.
reason=$(/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["points"][0]["ceilings"]["fio_read"]; print(c["status"], c["reason"])' "$work/bad.json" 2>/dev/null)
[[ $reason == "n/a fio not found"* ]] && ok "--disk-ceiling fio, fio missing: n/a ($reason)" \
  || bad "--disk-ceiling fio without fio ('$reason')"

# 4. CUDA pages where the build or host has none: one clear line, exit 2 (a build with
#    CUDA pages on a GPU host may run it: exit 0).
err=$("$bench" --device cuda:0 --workload publish-only --routes dram --working-set 1mib \
  "${tiny[@]}" --ssd-dir "$work/cuda" 2>&1) && rc=0 || rc=$?
[[ $rc -eq 0 || ($rc -eq 2 && $err == *"--device cuda:0"*) ]] \
  && ok "--device cuda:0: exit $rc" || bad "--device cuda:0 (rc $rc: $err)"

# 5. scale: every figure present, restores verified.
"$bench" --workload scale --model tiny --scale-chain-tokens 4096 --scale-engines 2 \
  --scale-objects 3000 --latency-probes 16 --ceiling-seconds 0.2 --manager "$manager" \
  --ssd-dir "$work/scale" --json "$work/scale.json" >"$work/scale.txt" 2>&1 && rc=0 || rc=$?
scale=$(/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
ok = (len(r["query_vs_chain"]) == 3 and r["query_vs_chain"][-1]["blocks"] == 256
      and all(q["query"]["n"] == 200 for q in r["query_vs_chain"])
      and [e["engines"] for e in r["engines"]] == [1, 2]
      and all(e["restore_gbps"] > 0 and e["publish_gbps"] > 0 for e in r["engines"])
      and r["directory"]["objects"] == 3000 and r["directory"]["rss_after"] > 0
      and r["storm"]["idle"]["n"] == 16 and r["storm"]["storm"]["n"] == 16
      and r["verification"]["checked"] > 0 and r["verification"]["mismatched"] == 0)
print(ok)' "$work/scale.json" 2>/dev/null)
[[ $rc -eq 0 && $scale == True ]] && ok "scale: chain, engines, directory and storm figures" \
  || { bad "scale (rc $rc, $scale)"; tail -20 "$work/scale.txt"; }

# 6. --storage-codec: ans restores verified byte for byte through the SSD with its ratio
#    printed; fp8 (lossy) runs without the byte check; an unknown codec is exit 2.
for c in ans fp8; do
  "$bench" --workload restore-only "${tiny[@]}" --routes ssd-uring --working-set 4mib \
    --pool-size 16mib --storage-codec $c --ssd-dir "$work/codec-$c" --json "$work/codec-$c.json" \
    >"$work/codec-$c.txt" 2>&1 && rc=0 || rc=$?
  line=$(grep -E "codec $c: ratio [0-9.]+x written" "$work/codec-$c.txt")
  [[ $rc -eq 0 && -n $line ]] && ok "--storage-codec $c: $(echo $line)" \
    || { bad "--storage-codec $c (rc $rc)"; tail -20 "$work/codec-$c.txt"; }
done
grep -q "verification       OK" "$work/codec-ans.txt" && ok "--storage-codec ans: verified" \
  || bad "--storage-codec ans: no verification OK line"
ansjson=$(/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
c = r["points"][0]["routes"][0]["codec"]
print(r["storage_codec"] == "ans" and c["codec"] == "ans" and c["ratio_written"] > 0
      and c["ratio_read"] > 0 and c["encode_gbps"] > 0 and c["decode_gbps"] > 0
      and c["effective_kv_gbps"] > 0 and c["stored_gbps"] > 0
      and c["effective_fraction_of_ceiling"] is not None)' "$work/codec-ans.json" 2>/dev/null)
[[ $ansjson == True ]] && ok "--storage-codec ans: JSON codec fields (ratios, GB/s, ceiling)" \
  || bad "--storage-codec ans: JSON codec fields ($ansjson)"
# 6b. Encoded DRAM copies (dram-encoded: --codec-dram-copy encoded) against raw ones (dram) in
#     the same run: only dram-encoded's DRAM holds encoded objects and decodes them (host
#     pages: on the CPU); the fp8 target is n/a with its reason on host pages.
"$bench" --workload block-size-sweep --sweep-block-tokens 16 "${tiny[@]}" --routes dram,dram-encoded \
  --working-set 4mib --storage-codec fp8 --ssd-dir "$work/codec-dram" --json "$work/codec-dram.json" \
  >"$work/codec-dram.txt" 2>&1 && rc=0 || rc=$?
cdram=$(/usr/bin/python3 - "$work/codec-dram.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
errors = []
routes = {x["route"]: x for x in r["points"][0]["routes"]}
raw, enc = routes.get("dram", {}), routes.get("dram-encoded", {})
if raw.get("status") != "ok" or enc.get("status") != "ok":
    errors.append("a route did not run")
else:
    if not (enc["codec"]["dram_encoded_copies"] > 0 and enc["codec"]["decode_raw_bytes"] > 0
            and enc["restore"]["bytes"] > 0 and enc["codec"]["effective_kv_gbps"] > 0
            and enc["codec"]["stored_gbps"] < enc["codec"]["effective_kv_gbps"]):
        errors.append(f"dram-encoded codec {enc['codec']}")
    if not (raw["codec"]["dram_encoded_copies"] == 0 and raw["codec"]["decode_raw_bytes"] == 0
            and raw["restore"]["bytes"] > 0):
        errors.append(f"dram codec {raw['codec']}")
t = [x for x in r["targets"] if x["name"].startswith("fp8 effective DRAM -> HBM")]
if len(t) != 1 or t[0]["status"] != "n/a" or "host pages" not in t[0]["note"]:
    errors.append(f"target {t}")
print("; ".join(errors) if errors else "OK")
PY
)
[[ $rc -eq 0 && $cdram == OK ]] && ok "dram-encoded vs dram: encoded DRAM copies decoded, raw ones copied" \
  || { bad "dram-encoded vs dram (rc $rc: $cdram)"; tail -30 "$work/codec-dram.txt"; }
"$bench" --workload block-size-sweep --sweep-block-tokens 16 "${tiny[@]}" --routes dram,dram-encoded \
  --working-set 4mib --ssd-dir "$work/codec-none" >"$work/codec-none.txt" 2>&1 && rc=0 || rc=$?
grep -q "dram-encoded n/a: needs --storage-codec" "$work/codec-none.txt" \
  && ok "dram-encoded without --storage-codec: n/a with its reason" \
  || { bad "dram-encoded without a codec (rc $rc)"; tail -10 "$work/codec-none.txt"; }
"$bench" --storage-codec zstd "${tiny[@]}" >/dev/null 2>&1 && rc=0 || rc=$?
[[ $rc -eq 2 ]] && ok "--storage-codec zstd: exit 2" || bad "--storage-codec zstd: exit $rc"

# 7. A hybrid model (tiny-hybrid: full attention, a 64-token window, GDN checkpoints at every
#    block) registers its model description: every query is a recovery plan, the engines restore
#    exactly its pieces (byte-exact) and the window blocks before P - W and older checkpoints are
#    not read (not_needed_bytes > 0; a bench that registered the blocks as a dense chain reads
#    them all and reports 0). The naive route is n/a with its reason. Then restore-only: the
#    plans come from SSD through io_uring.
hyb=(--model tiny-hybrid --engines 2 --users 2 --rounds 3 --system-prompt-tokens 256
     --history-tokens 256 --question-tokens 32 --answer-tokens 32 --latency-probes 8
     --ceiling-seconds 0.2 --fio-file-size 16mib --manager "$manager" --no-progress)
"$bench" --workload multi-round-qa "${hyb[@]}" --routes dram,ssd-uring,naive \
  --ssd-dir "$work/hybrid" --json "$work/hybrid.json" >"$work/hybrid.txt" 2>&1 && rc=0 || rc=$?
hybrid=$(/usr/bin/python3 - "$work/hybrid.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
errors = []
v = r["verification"]
if not (v["passed"] and v["verified_blocks"] > 0):
    errors.append(f"verification {v}")
if not r["model"]["hybrid"] or [g["kind"] for g in r["model"]["recovery_groups"]["groups"]] != [
        "full attention", "sliding window", "recurrent"]:
    errors.append(f"model {r['model']}")
routes = {x["route"]: x for x in r["points"][0]["routes"]}
for name in ("dram", "ssd-uring"):
    x = routes.get(name, {})
    rec = x.get("recovery", {})
    if x.get("status") != "ok":
        errors.append(f"route {name} did not run")
        continue
    if not (rec["not_needed_bytes"] > 0 and rec["pieces"] > 0 and rec["prefix_tokens"] > 0
            and rec["checkpoint_bytes"] > 0 and rec["restored_bytes"] > 0):
        errors.append(f"route {name} recovery {rec}")
    if x["hits"]["dram"] + x["hits"]["ssd"] <= 0 or not x["verification"]["ok"]:
        errors.append(f"route {name} hits {x['hits']} verification {x['verification']}")
    if x["verification"]["verified_blocks"] < rec["pieces"]:
        errors.append(f"route {name}: {x['verification']['verified_blocks']} verified < {rec['pieces']} pieces")
if routes.get("naive", {}).get("status") != "n/a" or "dense chains" not in routes["naive"].get("reason", ""):
    errors.append(f"naive route {routes.get('naive')}")
print("; ".join(errors) if errors else "OK")
PY
)
[[ $rc -eq 0 && $hybrid == OK ]] \
  && ok "hybrid multi-round-qa: plans restored byte-exact, not_needed_bytes > 0, naive n/a" \
  || { bad "hybrid multi-round-qa (rc $rc: $hybrid)"; tail -30 "$work/hybrid.txt"; }
grep -q "not needed" "$work/hybrid.txt" && grep -q "recovery     the model description" "$work/hybrid.txt" \
  && ok "hybrid summary: the recovery table" || bad "hybrid summary lacks the recovery table"
"$bench" --workload restore-only "${hyb[@]}" --routes ssd-uring --working-set 4mib \
  --pool-size 16mib --blocks-per-request 8 --ssd-dir "$work/hybrid-ssd" \
  --json "$work/hybrid-ssd.json" >"$work/hybrid-ssd.txt" 2>&1 && rc=0 || rc=$?
hssd=$(/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
x = r["points"][0]["routes"][0]
print(x["restore"]["bytes"] > 0 and x["hits"]["ssd"] > 0 and x["hits"]["dram"] == 0
      and x["recovery"]["not_needed_bytes"] > 0 and r["verification"]["passed"])' "$work/hybrid-ssd.json" 2>/dev/null)
[[ $rc -eq 0 && $hssd == True ]] && ok "hybrid restore-only: plans from SSD, verified" \
  || { bad "hybrid restore-only (rc $rc, $hssd)"; tail -20 "$work/hybrid-ssd.txt"; }
"$bench" --workload scale --model tiny-hybrid --manager "$manager" >/dev/null 2>&1 && rc=0 || rc=$?
[[ $rc -eq 2 ]] && ok "--workload scale --model tiny-hybrid: exit 2" || bad "scale with a hybrid model: exit $rc"

finish
