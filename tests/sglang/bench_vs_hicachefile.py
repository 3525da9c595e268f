#!/usr/bin/env python3
"""OrbitKV vs SGLang's own HiCacheFile backend, on the same host pool pages.

Both backends store and load the same working set of pages of one SGLang
MHATokenToKVPoolHost (CPU memory), the way SGLang's cache controller drives
them: OrbitKV through batch_set_v1 / batch_exists / batch_get_v1
(interface_v1), HiCacheFile through its generic path (batch_set of flat data
pages; batch_exists, batch_get into dummy pages, set_from_flat_data_page), in
batches of SGLang's STORAGE_BATCH_SIZE pages. Every loaded page is compared
with what was stored. It also measures OrbitKV's staging copy alone (pool page
<-> staging, the one copy the adapter adds) and a memcpy ceiling.

HiCacheFile's loads right after its stores come from the page cache; "cold"
drops each file from the page cache first (posix_fadvise DONTNEED), so it reads
the disk. OrbitKV's working set sits in the Manager's DRAM pool (sized to hold
it).

    python tests/sglang/bench_vs_hicachefile.py --pages 128 --layout page_first
    (PYTHONPATH=<build>/python, in the SGLang venv; --manager or
     $ORBITKV_MANAGER_BINARY names orbitkv-cache-manager)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Only CUDA")

import torch  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    STORAGE_BATCH_SIZE,
    HiCacheFile,
    HiCacheStorageConfig,
)
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402

from orbitkv.sglang import OrbitKVStorage  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def make_pool(args, pages: int) -> MHATokenToKVPoolHost:
    dt = torch.bfloat16
    k = tuple(torch.zeros(args.page_size, args.heads, args.head_dim, dtype=dt) for _ in range(args.layers))
    v = tuple(torch.zeros(args.page_size, args.heads, args.head_dim, dtype=dt) for _ in range(args.layers))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=args.page_size, head_num=args.heads, head_dim=args.head_dim,
        v_head_dim=args.head_dim, dtype=dt, device=torch.device("cpu"),
    )
    with host_memory_budget_scope(1 << 40):  # not SGLang's free-RAM-minus-10-GB rule
        pool = MHATokenToKVPoolHost(
            info, 1.0, 0, args.page_size, args.layout, pin_memory=False, device="cpu",
            device_capacity_tokens=args.page_size, start_layer=0, end_layer=args.layers,
            host_token_capacity=pages * args.page_size,
        )
    pool._keep = (k, v)
    return pool


def page(pool, p: int) -> torch.Tensor:
    return pool.get_data_page(p * pool.page_size, flat=True).view(torch.uint8)


def token_indices(pool, pages) -> torch.Tensor:
    ps = pool.page_size
    return torch.cat([torch.arange(p * ps, (p + 1) * ps) for p in pages])


def config(args, extra) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False,
        is_page_first_layout=args.layout != "layer_first", model_name="bench/model",
        extra_config=extra,
    )


def batches(n: int):
    for start in range(0, n, STORAGE_BATCH_SIZE):
        yield start, min(n, start + STORAGE_BATCH_SIZE)


class OrbitKVRun:
    """A writer and a reader backend (two connections, two pools), kept across
    runs as SGLang keeps its backend: their staging regions are warm after the
    first run, which is not measured."""

    def __init__(self, args, src, dst, socket_path):
        extra = {"backend_name": "orbitkv", "module_path": "orbitkv.sglang",
                 "class_name": "OrbitKVStorage", "interface_v1": 1, "socket": socket_path,
                 "staging_bytes": args.staging_mib << 20, "namespace": f"bench{os.getpid()}"}
        self.src, self.dst = src, dst
        self.w, self.r = OrbitKVStorage(config(args, extra)), OrbitKVStorage(config(args, extra))
        self.w.register_mem_pool_host(src)
        self.r.register_mem_pool_host(dst)

    def __call__(self, keys):
        n = len(keys)
        t0 = time.perf_counter()
        for a, b in batches(n):
            if not all(self.w.batch_set_v1(keys[a:b], token_indices(self.src, range(a, b)))):
                raise RuntimeError("orbitkv: a set failed")
        t_set = time.perf_counter() - t0
        t0 = time.perf_counter()
        for a, b in batches(n):
            if self.r.batch_exists(keys[a:b]) != b - a:
                raise RuntimeError("orbitkv: pages missing")
            if not all(self.r.batch_get_v1(keys[a:b], token_indices(self.dst, range(a, b)))):
                raise RuntimeError("orbitkv: a get failed")
        t_get = time.perf_counter() - t0
        return t_set, t_get

    def close(self):
        self.w.close()
        self.r.close()


def run_hicachefile(args, src, dst, keys, directory, cold):
    shutil.rmtree(directory, ignore_errors=True)
    extra = {"file_storage_path": str(directory)}
    f = HiCacheFile(config(args, extra), file_path=str(directory))
    n = len(keys)
    t0 = time.perf_counter()
    for a, b in batches(n):
        if not f.batch_set(keys[a:b], [src.get_data_page(p * src.page_size) for p in range(a, b)]):
            raise RuntimeError("hicachefile: a set failed")
    os.sync()
    t_set = time.perf_counter() - t0
    if cold:
        for name in os.listdir(directory):
            fd = os.open(directory / name, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    t0 = time.perf_counter()
    for a, b in batches(n):
        if f.batch_exists(keys[a:b]) != b - a:
            raise RuntimeError("hicachefile: pages missing")
        got = f.batch_get(keys[a:b], [dst.get_dummy_flat_data_page() for _ in range(a, b)])
        for p, data in zip(range(a, b), got):
            if data is None:
                raise RuntimeError("hicachefile: a get failed")
            dst.set_from_flat_data_page(p * dst.page_size, data)
    t_get = time.perf_counter() - t0
    shutil.rmtree(directory, ignore_errors=True)
    return t_set, t_get


def copy_ceilings(src, page_bytes: int, pages: int):
    """The adapter's own copy (pool page <-> staging, torch) and a flat memcpy."""
    staging = torch.zeros(pages * page_bytes, dtype=torch.uint8)  # touched: no page faults timed
    t0 = time.perf_counter()
    for p in range(pages):
        d = src.get_data_page(p * src.page_size, flat=False)
        staging[p * page_bytes:(p + 1) * page_bytes].view(d.dtype).view(d.shape).copy_(d)
    t_out = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p in range(pages):
        src.set_from_flat_data_page(p * src.page_size,
                                    staging[p * page_bytes:(p + 1) * page_bytes].view(src.dtype))
    t_in = time.perf_counter() - t0
    flat = src.kv_buffer.view(torch.uint8).view(-1)[: pages * page_bytes]
    t0 = time.perf_counter()
    staging.copy_(flat)
    t_memcpy = time.perf_counter() - t0
    return t_out, t_in, t_memcpy


def start_manager(binary: str, workdir: Path, pool_bytes: int):
    sock = str(workdir / "m.sock")
    log = open(workdir / "manager.log", "wb")
    proc = subprocess.Popen(
        [binary, "--socket", sock, "--metrics-port", "0", "--pool-size", str(pool_bytes)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((workdir / "manager.log").read_text())
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
            return proc, sock
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    proc.kill()
    raise RuntimeError("the Manager did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=128, help="working set in pages (default 128)")
    ap.add_argument("--layout", default="page_first", choices=["layer_first", "page_first", "page_first_direct"])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16, help="tokens per page")
    ap.add_argument("--staging-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="best of N runs per backend")
    ap.add_argument("--file-dir", default=os.environ.get("TMPDIR", "/var/tmp"),
                    help="where HiCacheFile writes (a disk-backed directory)")
    ap.add_argument("--manager", default=os.environ.get(
        "ORBITKV_MANAGER_BINARY", str(REPO / "build" / "src" / "server" / "orbitkv-cache-manager")))
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    src, dst = make_pool(args, args.pages), make_pool(args, args.pages)
    raw = src.kv_buffer.view(torch.uint8).view(-1)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    page_bytes = page(src, 0).numel()
    total = page_bytes * args.pages
    keys = [f"{i:064x}" for i in range(args.pages)]
    work = Path(tempfile.mkdtemp(prefix="okv-sgl-bench-", dir=args.file_dir))
    # The pool holds every run's pages: (1 + repeats) working sets.
    proc, sock = start_manager(args.manager, work, (args.repeats + 2) * total + (256 << 20))
    rows = {}

    def check(name):
        for p in range(args.pages):
            if not torch.equal(page(src, p), page(dst, p)):
                raise SystemExit(f"{name}: page {p} differs")
        dst.kv_buffer.view(torch.uint8).zero_()

    okv = OrbitKVRun(args, src, dst, sock)
    try:
        for name, fn in [
            ("orbitkv", lambda i: okv([f"{k}-{i}" for k in keys])),
            ("hicachefile", lambda i: run_hicachefile(args, src, dst, keys, work / "hf", False)),
            ("hicachefile-cold", lambda i: run_hicachefile(args, src, dst, keys, work / "hf", True)),
        ]:
            best = [float("inf"), float("inf")]
            for i in range(-1, args.repeats):  # run -1 warms up, unmeasured
                t_set, t_get = fn(i)
                check(name)
                if i >= 0:
                    best = [min(best[0], t_set), min(best[1], t_get)]
            rows[name] = {"set_gbps": total / best[0] / 1e9, "get_gbps": total / best[1] / 1e9}
        t_out, t_in, t_memcpy = copy_ceilings(src, page_bytes, args.pages)
    finally:
        okv.close()
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)

    print(f"pages: {args.pages} x {page_bytes / 2**20:.2f} MiB = {total / 2**20:.0f} MiB, "
          f"layout {args.layout}, {args.layers} layers x {args.heads} heads x {args.head_dim}, "
          f"{args.page_size} tokens/page, batches of {STORAGE_BATCH_SIZE}, best of {args.repeats} after a warm-up, "
          f"torch threads {torch.get_num_threads()}, every page verified")
    print(f"{'backend':<18} {'set GB/s':>9} {'get GB/s':>9}")
    for name, r in rows.items():
        print(f"{name:<18} {r['set_gbps']:>9.2f} {r['get_gbps']:>9.2f}")
    copies = {"pool_to_staging_gbps": total / t_out / 1e9, "staging_to_pool_gbps": total / t_in / 1e9,
              "memcpy_gbps": total / t_memcpy / 1e9}
    print(f"staging copy alone: pool->staging {copies['pool_to_staging_gbps']:.2f} GB/s, "
          f"staging->pool {copies['staging_to_pool_gbps']:.2f} GB/s; "
          f"flat memcpy {copies['memcpy_gbps']:.2f} GB/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "backends": rows, "copies": copies}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
