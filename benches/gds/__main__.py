"""python -m benches.gds: qualify native GPUDirect Storage on a bare-metal host.

Refuses (exit 3, one line) inside a container or VM, on a --ssd-dir that is
not ext4/XFS on NVMe, with a tool, library or artifact missing, or when
cuFile's compatibility mode would stay on. Otherwise runs the spec's sequence
with prebuilt artifacts (nothing is built) and writes qualification.json in a
new private directory under --ssd-dir. Exit 0: every stage passed; 1: a stage
failed or was not available; 2: bad flags; 3: refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from benches.gds import preflight as pf
from benches.gds import stages

DEFAULT_CODECS = ["none", "ans", "fp8", "turboquant-4", "turboquant-3"]
CODECS = set(DEFAULT_CODECS)
EXIT_QUALIFIED, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benches.gds",
        description="Native GPUDirect Storage qualification of a bare-metal GPU + NVMe host "
        "(spec: Bare-metal acceptance script). Writes <ssd-dir>/orbitkv-qual-*/qualification.json.",
    )
    g = p.add_argument_group("required")
    g.add_argument("--ssd-dir", help="directory on an NVMe-backed ext4/XFS mount; a new private subdirectory holds everything")
    g.add_argument("--model", help="model directory for the real-model and engine checks (e.g. /models/Qwen3-8B)")
    g.add_argument("--manager", help="prebuilt orbitkv-cache-manager")
    g.add_argument("--fault-manager", help="prebuilt orbitkv-cache-manager-faults (the test-hooks Manager)")
    g.add_argument("--core-test", help="prebuilt gpu_tier_gate_cuda_test (the CUDA gate executable)")
    g.add_argument("--gds-tools", help="directory with NVIDIA's gdscheck.py, gdsio and gds_stats")
    g.add_argument("--cufile-library", help="the libcufile.so.0 to qualify (e.g. /usr/local/cuda/lib64/libcufile.so.0)")
    o = p.add_argument_group("artifacts found next to --manager unless given")
    o.add_argument("--bench", help="orbitkv-bench (default: next to --manager, or ../bench/ in a build tree)")
    o.add_argument("--cuda-engine", help="orbitkv-cuda-engine (default: next to --manager, or ../gpu/tests/)")
    o.add_argument("--cufile-json", help="cufile.json to copy (default: $CUFILE_ENV_PATH_JSON, /etc/cufile.json, <library>/../gds/cufile.json)")
    o.add_argument("--repo", default=REPO, help="OrbitKV checkout whose python/ tests the engine checks run (default: this one)")
    e = p.add_argument_group("engine environments (a missing one makes its checks 'not available', a failure)")
    e.add_argument("--vllm-python", help="python of the vLLM environment")
    e.add_argument("--sglang-python", help="python of the SGLang environment")
    e.add_argument("--model-python", help="python for the real-model check (default: --vllm-python)")
    for flag, what in (("model", "real-model"), ("vllm", "vLLM"), ("sglang", "SGLang")):
        e.add_argument(f"--{flag}-check", help=f"command template of the {what} check (placeholders {{python}} "
                       "{repo} {model} {manager} {codec} {backend} {workdir} {gpu} {cufile_library}; exit 0 "
                       "pass, 77 not available)")
    e.add_argument("--engine-backends", nargs="+", default=["cufile"], choices=["cufile", "auto"],
                   help="SSD backends of the engine checks (default: cufile)")
    e.add_argument("--engine-timeout", type=int, default=3600, help="seconds per engine check")
    m = p.add_argument_group("matrix")
    m.add_argument("--storage-codecs", nargs="+", default=DEFAULT_CODECS, metavar="CODEC",
                   help="storage codecs (default: none ans fp8 turboquant-4 turboquant-3; lossless only: none ans)")
    m.add_argument("--workloads", nargs="+", default=["serial-prefix", "sustained-mixed-prefix"],
                   help="orbitkv-bench workloads")
    m.add_argument("--routes", nargs="+", default=list(stages.BENCH_ROUTES), choices=list(stages.BENCH_ROUTES),
                   help="benchmark routes (default: dram io_uring auto cufile)")
    m.add_argument("--seed", type=int, default=1, help="the same seed for every run")
    m.add_argument("--pool-size", default="8gib", help="the same Manager DRAM pool for every run")
    m.add_argument("--ssd-capacity", default="64gib", help="the same SSD capacity for every run")
    m.add_argument("--bench-args", default="", help="extra orbitkv-bench flags for every run (workload sizes)")
    m.add_argument("--bench-timeout", type=int, default=3600, help="seconds per benchmark run")
    t = p.add_argument_group("native tools")
    t.add_argument("--gpu", type=int, default=0, help="CUDA device (default 0)")
    t.add_argument("--gdsio-size", default="1G", help="gdsio file size")
    t.add_argument("--gdsio-io-size", default="1M", help="gdsio I/O size")
    t.add_argument("--gdsio-threads", type=int, default=4, help="gdsio workers")
    t.add_argument("--gdsio-seconds", type=int, default=10, help="gdsio run time (long enough for gds_stats)")
    t.add_argument("--gate-timeout", type=int, default=900, help="seconds per GPU gate")
    t.add_argument("--sample-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    t.add_argument("--fault-ssd-capacity", default="4gb", help="SSD capacity of the fault-stage Managers")
    return p


def parse_args(argv) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    bad = [c for c in a.storage_codecs if c not in CODECS]
    if bad:
        p.error(f"--storage-codecs: unknown codec {bad[0]!r} (known: {' '.join(DEFAULT_CODECS)})")
    a.repo = os.path.realpath(a.repo)
    return a


def _clean(obj):
    if dataclasses.is_dataclass(obj):
        return _clean(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_clean(v) for v in obj]
    return obj


def report(run: stages.Run, started: float, finished: bool) -> dict:
    statuses = [r.status for r in run.results]
    qualified = finished and bool(statuses) and all(s == stages.PASSED for s in statuses)
    return _clean({
        "tool": "benches.gds",
        "format": 1,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": finished,
        "qualified": qualified,
        "counts": {s: statuses.count(s) for s in (stages.PASSED, stages.FAILED, stages.NOT_AVAILABLE)},
        "host": {
            "ssd_dir": run.p.ssd_dir,
            "mount": run.p.storage.mount,
            "nvme_devices": run.p.storage.devices,
            "virtualization_findings": run.p.virtualization,
        },
        "config": {
            "run_dir": run.dir,
            "cufile_json": run.p.cufile_json,
            "cufile_json_source": run.p.cufile_source,
            "artifacts": run.p.artifacts,
            "tools": run.p.tools,
            "storage_codecs": run.args.storage_codecs,
            "workloads": run.args.workloads,
            "routes": run.args.routes,
            "seed": run.args.seed,
            "pool_size": run.args.pool_size,
            "ssd_capacity": run.args.ssd_capacity,
            "environment": {k: run.env[k] for k in ("CUFILE_ENV_PATH_JSON", "CUFILE_ALLOW_COMPAT_MODE",
                                                    "CUFILE_FORCE_COMPAT_MODE", "ORBITKV_CUFILE_LIBRARY",
                                                    "TMPDIR") if k in run.env},
        },
        "stages": run.results,
        "runs": run.runs,
    })


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None, root="/", environ=None, detect_virt=None, sequence=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_QUALIFIED
    started = time.time()
    try:
        prepared = pf.preflight(args, root=root, environ=environ, detect_virt=detect_virt)
    except pf.Refusal as r:
        print(f"benches.gds: {r}", file=sys.stderr)
        return EXIT_REFUSED
    out = os.path.join(prepared.run_dir, "qualification.json")
    print(f"benches.gds: run directory {prepared.run_dir}", flush=True)
    run = stages.Run(args, prepared, on_result=lambda r: write_json(out, report(r, started, False)))
    for step in stages.SEQUENCE if sequence is None else sequence:
        try:
            step(run)
        except Exception as e:  # a broken stage is a failed stage; the rest still runs
            run.add(stages.StageResult(step.__name__, 0, stages.FAILED, f"internal error: {type(e).__name__}: {e}"))
    data = report(run, started, True)
    write_json(out, data)
    c = data["counts"]
    verdict = "QUALIFIED" if data["qualified"] else "NOT QUALIFIED"
    print(f"benches.gds: {verdict}: {c['passed']} passed, {c['failed']} failed, "
          f"{c['not available']} not available; {out}", flush=True)
    return EXIT_QUALIFIED if data["qualified"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
