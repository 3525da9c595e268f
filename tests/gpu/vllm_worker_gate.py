#!/usr/bin/env python3
"""The vLLM connector's worker side on CUDA pages, without vLLM (run on a GPU host).

Replays the connector metadata that vLLM's real scheduler produced in the CPU
test (tests/vllm/fixtures/worker_replay.json, recorded by
test_prefix_hit_across_requests_restores_the_saved_blocks) through
orbitkv.vllm.worker.WorkerCore, with torch CUDA tensors in each of vLLM's KV
layouts (per-layer (2, num_blocks, ...), block-first, HND strides) allocated
by PyTorch's caching allocator (regions from real pointers, strides and IPC
handles): the forward's rows are written on the GPU, saved through the
Manager, restored into the planned blocks and compared byte for byte.

  PYTHONPATH=<build>/python python3 tests/gpu/vllm_worker_gate.py \
      --manager <build>/src/server/orbitkv-cache-manager [--device cuda:0] [--ssd-dir /var/tmp]

Prints one PASS line per layout and exits 0; a wrong byte or a load error
prints FAIL and exits 1; no CUDA device exits 77 (skip).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vllm"))

import kvreplay  # noqa: E402


def wait_listening(path: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"FAIL: the Manager exited with {proc.returncode}:\n{log.read_text()}")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    sys.exit(f"FAIL: the Manager did not listen:\n{log.read_text()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manager", required=True, help="orbitkv-cache-manager (a CUDA build)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N, or host to check the script on CPU")
    ap.add_argument("--fixture", default=str(HERE.parent / "vllm" / "fixtures" / "worker_replay.json"))
    ap.add_argument("--ssd-dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    args = ap.parse_args()

    import torch

    from orbitkv.vllm.config import ConnectorConfig
    from orbitkv.vllm.layout import describe_kv_caches, host_tensor
    from orbitkv.vllm.worker import WorkerCore

    host = args.device == "host"  # the same replay on host tensors: checks this script on CPU
    if not host and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77

    rec = json.loads(Path(args.fixture).read_text())
    work = Path(tempfile.mkdtemp(prefix="orbitkv-vllm-gate-", dir=args.ssd_dir))
    sock, log = str(work / "m.sock"), work / "manager.log"
    cmd = [args.manager, "--socket", sock, "--metrics-port", "0", "--pool-size", "256mib",
           "--ssd-cache-path", str(work / "cache.bin"), "--ssd-cache-capacity", "1gib"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    failed = False
    try:
        wait_listening(sock, proc, log)
        if host:
            allocate, ready = host_tensor, None
        else:
            torch.cuda.set_device(torch.device(args.device))
            ready = torch.cuda.synchronize
            allocate = lambda shape, dtype: torch.zeros(shape, dtype=dtype, device=args.device)  # noqa: E731
        for layout in kvreplay.LAYOUTS:
            spec = dict(rec["spec"], layout=layout)
            kv = kvreplay.make_kv_caches(spec, args.device, allocate)
            desc = describe_kv_caches(kv, spec["num_blocks"])
            core = WorkerCore(ConnectorConfig(socket_path=sock), rec["namespace"] + f"|gate={layout}", 0)
            core.register(desc)
            if core._client is None:
                print(f"FAIL layout={layout}: registration failed (see {log})")
                failed = True
                continue
            try:
                result = kvreplay.replay(rec, core, kv, ready=ready, layout=layout)
                stats = core.take_stats()
                print(f"PASS layout={layout} device={desc.device} regions={len(desc.region_bytes)} "
                      f"slots={len(desc.slots)} steps={result['steps']} "
                      f"checked_tokens={result['checked_tokens']} "
                      f"restored_blocks={stats['restored_blocks_dram'] + stats['restored_blocks_ssd']} "
                      f"saved_blocks={stats['saved_blocks']}")
            except AssertionError as e:
                print(f"FAIL layout={layout}: {e}")
                failed = True
            finally:
                core.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.returncode not in (0, None):
            print(f"FAIL: the Manager exited with {proc.returncode}:\n{log.read_text()}")
            failed = True
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
