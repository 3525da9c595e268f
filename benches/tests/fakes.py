"""Stand-ins for the host that benches.gds qualifies, for its source-level tests:
fake sysfs/proc trees (bare metal with NVMe, containers, microVMs) and fake
GDS tools and OrbitKV artifacts as small Python scripts that behave like the
real ones where benches.gds looks (output formats, exit codes, child
processes, /metrics, the Unix socket)."""

from __future__ import annotations

import os
import re
import sys
import textwrap

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def write(path: str, text: str, mode: int = 0o644) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def script(path: str, body: str) -> str:
    return write(path, f"#!{sys.executable}\n" + textwrap.dedent(body), 0o755)


def link(root: str, path: str, target: str) -> None:
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    os.symlink(target, full)


NVME_PART = "devices/pci0000:00/0000:00:01.1/0000:3b:00.0/nvme/nvme0/nvme0n1/nvme0n1p1"
NVME1_DISK = "devices/pci0000:00/0000:00:01.2/0000:5e:00.0/nvme/nvme1/nvme1n1"
SATA_PART = "devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda/sda1"
VIRTIO_DISK = "devices/pci0000:00/0000:00:02.0/virtio1/block/vda"


def bare_metal(root: str, mount_point: str, fstype: str = "ext4", majmin: str = "259:1",
               target: str = NVME_PART) -> str:
    """A bare-metal host whose `mount_point` is `fstype` on device `majmin` (a
    partition of an NVMe namespace unless `target` says otherwise)."""
    write(f"{root}/proc/1/cgroup", "0::/init.scope\n")
    write(f"{root}/proc/1/environ", "HOME=/\0TERM=linux\0")
    write(f"{root}/proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\n"
          "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ht syscall nx lm\n")
    write(f"{root}/sys/class/dmi/id/product_name", "PowerEdge XE9680\n")
    write(f"{root}/sys/class/dmi/id/sys_vendor", "Dell Inc.\n")
    mp = mount_point.replace(" ", "\\040")
    write(f"{root}/proc/self/mountinfo",
          "1 0 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
          "22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n"
          "23 1 0:22 / /sys rw,nosuid shared:2 - sysfs sysfs rw\n"
          f"95 1 {majmin} / {mp} rw,noatime shared:40 - {fstype} /dev/{os.path.basename(target)} rw,attr2\n")
    sys_block(root, majmin, target)
    write(f"{root}/sys/devices/pci0000:00/0000:00:01.1/0000:3b:00.0/nvme/nvme0/transport", "pcie\n")
    return root


def sys_block(root: str, majmin: str, target: str) -> None:
    """/sys/dev/block/MAJ:MIN -> ../../<target> (relative, as in real sysfs);
    a partition (nvme0n1p1, sda1, vda1) gets its `partition` file."""
    os.makedirs(f"{root}/sys/{target}", exist_ok=True)
    if re.search(r"(nvme\d+n\d+p\d+|[sv]d[a-z]+\d+)$", target):
        write(f"{root}/sys/{target}/partition", "1\n")
    if not os.path.lexists(f"{root}/sys/dev/block/{majmin}"):
        link(root, f"sys/dev/block/{majmin}", f"../../{target}")


# ------------------------------------------------------------------ tools

GDSCHECK = r'''
import json, os, sys
native = open(os.path.join(os.environ["FAKE_FIXTURES"], "gdscheck_native.txt")).read()
if os.environ.get("FAKE_GDSCHECK_COMPAT"):
    native = native.replace("properties.use_compat_mode : false", "properties.use_compat_mode : true")
else:
    # What cuFile loads: the file CUFILE_ENV_PATH_JSON names, else /etc/cufile.json.
    cfg = json.load(open(os.environ["CUFILE_ENV_PATH_JSON"]))
    allow = cfg.get("properties", {}).get("allow_compat_mode", True)
    native = native.replace("properties.use_compat_mode : false",
                            "properties.use_compat_mode : " + ("true" if allow else "false"))
    native = native.replace("profile.cufile_stats : 3",
                            "profile.cufile_stats : %s" % cfg.get("profile", {}).get("cufile_stats", 0))
print(native, end="")
'''

GDSIO = r'''
import os, sys, time
a = sys.argv[1:]
kind = "WRITE" if a[a.index("-I") + 1] == "1" else "READ"
open(a[a.index("-f") + 1], "ab").close()
time.sleep(float(os.environ.get("FAKE_GDSIO_SECONDS", "0.6")))
xfer = os.environ.get("FAKE_GDSIO_XFER", "GPUD")
print("IoType: %s XferType: %s Threads: 4 DataSetSize: 8388608/1048576(KiB) IOSize: 1024(KiB) "
      "Throughput: 6.524658 GiB/sec, Avg_Latency: 1197.370995 usecs ops: 8192 total_time 1.226 secs" % (kind, xfer))
'''

GDS_STATS = r'''
import os, sys
a = sys.argv[1:]
pid = a[a.index("-p") + 1]
if not os.path.exists("/proc/%s" % pid):
    print("Error: process %s not found or cufile stats shared memory not present" % pid, file=sys.stderr)
    sys.exit(1)
if os.environ.get("FAKE_GDS_STATS_DISABLED"):
    print("cufile_stats not enabled for process %s" % pid, file=sys.stderr)
    sys.exit(1)
name = os.environ.get("FAKE_GDS_STATS_FIXTURE", "gds_stats_v7.txt")
print(open(os.path.join(os.environ["FAKE_FIXTURES"], name)).read(), end="")
'''

NVIDIA_SMI = r'''
import sys
if sys.argv[1:] == ["-L"]:
    print("GPU 0: NVIDIA H200 (UUID: GPU-2f9a1c44-d0e8-7b35-a61f-0c2d9e4b7a18)")
else:
    print("\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tPIX\t0-31\t0\n")
'''

CORE_TEST = r'''
import os, sys
gates = ["GpuTierGate.SplitLayoutWritesAndRestoresThroughCufile",
         "GpuTierGate.CheckpointLargerThanStagingIsSplitAcrossIt",
         "GpuTierGate.LeasedExtentIsNotOverwrittenByWrappingWrites",
         "GpuTierGate.FragmentedPublicationSealsInDramAndRestoresThroughCufile"]
if "--gtest_list_tests" in sys.argv:
    print("Running main() from gmock_main.cc\nGpuTierGate.")
    for g in gates:
        print("  " + g.split(".")[1])
    sys.exit(0)
flt = [a for a in sys.argv if a.startswith("--gtest_filter=")][0].split("=", 1)[1]
assert os.environ["TMPDIR"].startswith(os.environ["FAKE_RUN_PREFIX"]), os.environ["TMPDIR"]
assert os.environ["ORBITKV_GPU_TEST_REQUIRE_CUFILE"] == "1"
print("[==========] Running 1 test from 1 test suite.\n[ RUN      ] " + flt)
if flt == os.environ.get("FAKE_SKIP_GATE"):
    print("gpu_tier_gate_test.cc:75: Skipped\ncuFile unavailable: cuFileDriverOpen: 5001\n[  SKIPPED ] %s (0 ms)" % flt)
    print("[  PASSED  ] 0 tests.\n[  SKIPPED ] 1 test, listed below:")
    sys.exit(0)
if flt == os.environ.get("FAKE_FAIL_GATE"):
    print("[  FAILED  ] %s (3 ms)" % flt)
    sys.exit(1)
print("[       OK ] %s (12 ms)\n[  PASSED  ] 1 test." % flt)
'''

MANAGER = r'''
import http.server, os, signal, socket, sys, threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
a = sys.argv[1:]
def flag(f, d=None):
    return a[a.index(f) + 1] if f in a else d
port, path = int(flag("--metrics-port")), flag("--socket")
backend = flag("--ssd-backend", "auto")
hooks = os.environ.get("FAKE_HOOKS", "reads")
m = {"orbitkv_ssd_backend_fallbacks_total": 0, "orbitkv_ssd_cufile_read_failures_total": 0,
     "orbitkv_ssd_cufile_write_failures_total": 0}
if backend in ("auto", "cufile"):
    m["orbitkv_ssd_cufile_read_bytes_total"] = 268435456
    m["orbitkv_ssd_cufile_write_bytes_total"] = 134217728
else:
    m["orbitkv_ssd_uring_read_bytes_total"] = 268435456
if os.environ.get("FAKE_FALLBACK"):
    m["orbitkv_ssd_backend_fallbacks_total"] = 1
if os.environ.get("ORBITKV_TEST_FAIL_CUFILE_READS"):
    print("[warn] test hooks: the next 1 cuFile reads fail with EIO", flush=True)
    m["orbitkv_ssd_cufile_read_failures_total"] = 1
    m["orbitkv_ssd_backend_fallbacks_total"] = 1
if os.environ.get("ORBITKV_TEST_FAIL_CUFILE_WRITES") and hooks == "all":
    print("[warn] test hooks: the next 1 cuFile writes fail with EIO", flush=True)
    m["orbitkv_ssd_cufile_write_failures_total"] = 1
    m["orbitkv_ssd_backend_fallbacks_total"] = 1
if os.environ.get("ORBITKV_TEST_HOLD_CUFILE_WRITES_MS") and hooks == "all":
    print("[warn] test hooks: cuFile writes complete after 3000 ms", flush=True)
assert os.environ["CUFILE_ALLOW_COMPAT_MODE"] == "false"
assert os.environ["CUFILE_ENV_PATH_JSON"].startswith(os.environ["FAKE_RUN_PREFIX"])
text = "".join('%s{device="cuda:0"} %d\n' % kv for kv in m.items()) + \
    'orbitkv_ssd_uring_read_seconds_bucket{le="0.001"} 5\n'
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("# TYPE x counter\n" + text).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
s = socket.socket(socket.AF_UNIX)
if os.path.exists(path):
    os.unlink(path)
s.bind(path); s.listen(64)
threading.Thread(target=lambda: [s.accept() for _ in iter(int, 1)], daemon=True).start()
print("orbitkv-cache-manager ready: backend %s" % backend, flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
sys.exit(0)
'''

CUDA_ENGINE = r'''
import os, socket, sys, time
a = sys.argv[1:]
path = a[a.index("--socket") + 1]
blocks = int(a[a.index("--blocks") + 1]) if "--blocks" in a else 64
settle = int(a[a.index("--settle-ms") + 1]) / 1000 if "--settle-ms" in a else 0.1
def alive():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path); return True
    except OSError:
        return False
    finally:
        s.close()
if not alive() or os.environ.get("FAKE_ENGINE_CANNOT_CONNECT"):
    print("orbitkv-cuda-engine: connect: no Manager at " + path); sys.exit(1)
print("rank 0 on cuda:0: published %d blocks of 65536 bytes (%d sealed by this call)" % (blocks, blocks), flush=True)
end = time.time() + settle
while time.time() < end:
    if not alive():
        print("orbitkv-cuda-engine: query: connection reset by peer"); sys.exit(1)
    time.sleep(0.05)
print("rank 0: restore of %d SSD blocks: 0 failed (3.1 ms)" % blocks)
print("rank 0: verified %d restored blocks on cuda:0: 0 mismatching bytes" % blocks)
'''

BENCH = r'''
import json, os, signal, socket, subprocess, sys, time
a = sys.argv[1:]
if "--help" in a:
    print("orbitkv-bench: runs a named workload on each route\n  --routes TEXT  Comma-separated routes: dram, "
          "ssd-uring, ssd-auto (GPU tier), naive" + os.environ.get("FAKE_BENCH_HELP_EXTRA", ""))
    sys.exit(0)
def flag(f):
    return a[a.index(f) + 1]
route = flag("--routes")
backend = {"dram": "uring", "ssd-uring": "uring", "ssd-auto": "auto", "ssd-cufile": "cufile"}[route]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
sock = os.path.join(flag("--ssd-dir"), "orbitkv.sock")
m = subprocess.Popen([flag("--manager"), "--pool-size", flag("--pool-size"), "--ssd-backend", backend,
                      "--socket", sock, "--metrics-port", str(port)])
deadline = time.time() + 10
while not os.path.exists(sock):
    if m.poll() is not None or time.time() > deadline:
        print("orbitkv-bench: the Manager did not start", file=sys.stderr); sys.exit(3)
    time.sleep(0.02)
time.sleep(float(os.environ.get("FAKE_BENCH_SECONDS", "0.6")))
ok = not os.environ.get("FAKE_BENCH_MISMATCH")
report = {"bench": "orbitkv-bench", "workload": flag("--workload"), "seed": int(flag("--seed")),
          "capacities": {"pool_bytes": 8589934592, "ssd_bytes": 68719476736},
          "points": [{"block_tokens": 16, "routes": [{
              "route": route, "status": "ok",
              "restore": {"gbps": 9.5, "bytes": 1 << 30}, "publish": {"gbps": 4.2},
              "ttft": {"cached_ms": {"n": 40, "p50": 3.2, "p99": 7.9, "max": 9.0}},
              "cpu": {"who": "manager", "seconds": 1.5, "cores": 0.7},
              "amplification": {"read": 1.02}, "hits": {"ssd": 400},
              "verification": {"enabled": True, "verified_blocks": 400, "mismatched_blocks": 0 if ok else 3, "ok": ok}}]}]}
json.dump(report, open(flag("--json"), "w"))
m.send_signal(signal.SIGTERM); m.wait()
sys.exit(0 if ok else 1)
'''

CHECK = r'''
import json, os, sys
json.dump({"codec": os.environ["ORBITKV_STORAGE_CODEC"], "ttft_ms": 41.5, "argv": sys.argv[1:]},
          open(os.environ["ORBITKV_QUALIFICATION_RESULT"], "w"))
assert os.environ["LD_PRELOAD"].endswith("libcufile.so.0")
sys.exit(int(os.environ.get("FAKE_CHECK_EXIT", "0")))
'''


def tools(base: str) -> dict:
    """Every fake executable under `base`; returns their paths by role."""
    gds = os.path.join(base, "gds-tools")
    bin_ = os.path.join(base, "bin")
    art = os.path.join(base, "orbitkv")
    out = {
        "gds_tools": gds,
        "gdscheck": script(f"{gds}/gdscheck.py", GDSCHECK),
        "gdsio": script(f"{gds}/gdsio", GDSIO),
        "gds_stats": script(f"{gds}/gds_stats", GDS_STATS),
        "bin": bin_,
        "nvidia_smi": script(f"{bin_}/nvidia-smi", NVIDIA_SMI),
        "manager": script(f"{art}/orbitkv-cache-manager", MANAGER),
        "fault_manager": script(f"{art}/orbitkv-cache-manager-faults", MANAGER),
        "cuda_engine": script(f"{art}/orbitkv-cuda-engine", CUDA_ENGINE),
        "bench": script(f"{art}/orbitkv-bench", BENCH),
        "core_test": script(f"{art}/gpu_tier_gate_cuda_test", CORE_TEST),
        "check": script(f"{base}/check.py", CHECK),
        "cufile_library": write(f"{base}/cuda/lib64/libcufile.so.0", "ELF"),
        "model": os.path.join(base, "models", "Qwen3-8B"),
    }
    write(f"{base}/cuda/gds/cufile.json", fixture("cufile.json"))
    os.makedirs(out["model"], exist_ok=True)
    return out
