"""Fixtures for the SGLang adapter tests: SGLang's real host pools on CPU
memory, and real orbitkv-cache-manager processes (the Manager fixtures of
tests/python/conftest.py, loaded from there, not copied).

Run in the SGLang venv (scripts/sglang_env.sh) with PYTHONPATH=<build>/python
and ORBITKV_MANAGER_BINARY set, as scripts/test.sh does.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message="Only CUDA")  # sglang's quantization imports on CPU

_spec = importlib.util.spec_from_file_location(
    "orbitkv_python_conftest", Path(__file__).resolve().parents[1] / "python" / "conftest.py"
)
_python_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_python_conftest)
Manager = _python_conftest.Manager
manager_binary = _python_conftest.manager_binary
start_manager = _python_conftest.start_manager
manager = _python_conftest.manager

import torch  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402

LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def make_pool(layout: str, *, layers=3, heads=2, head_dim=8, page_size=4, device_tokens=64,
              dtype=torch.bfloat16, allocator_type="default") -> MHATokenToKVPoolHost:
    """SGLang's MHA host pool on CPU memory (the device-side buffers it mirrors are
    CPU tensors too), filled with random bytes."""
    k = tuple(torch.zeros(device_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(device_tokens, heads, head_dim, dtype=dtype) for _ in range(layers))

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=page_size, head_num=heads, head_dim=head_dim, v_head_dim=head_dim,
        dtype=dtype, device=torch.device("cpu"),
    )
    # SGLang sizes pools against free RAM minus a 10 GB reserve; book these
    # small test pools against an explicit budget instead.
    with host_memory_budget_scope(1 << 34):
        pool = MHATokenToKVPoolHost(
            info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
            allocator_type=allocator_type, device_capacity_tokens=device_tokens,
            start_layer=0, end_layer=layers,
        )
    pool._device_k = k  # keep the mirrored buffers alive with the pool
    pool._device_v = v
    raw = pool.kv_buffer.view(torch.uint8).view(-1)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    return pool


def make_mamba_pool(*, layers=2, checkpoints=16, seed=0) -> MambaPoolHost:
    """SGLang's Mamba state host pool on CPU memory (page_size 1: one checkpoint
    per index), every state filled with random bytes through its own API."""
    info = MambaStateBufferInfo(
        temporal=torch.zeros(layers, checkpoints, 4, 8, dtype=torch.float32),
        conv=(torch.zeros(layers, checkpoints, 3, 8, dtype=torch.bfloat16),),
    )
    with host_memory_budget_scope(1 << 34):
        pool = MambaPoolHost(info, 2.0, 0, device_capacity=checkpoints, pin_memory=False,
                             device="cpu", layout="page_first")
    pool._device_info = info
    g = torch.Generator().manual_seed(seed)
    n = pool.get_dummy_flat_data_page().numel()
    for i in range(pool.size):
        pool.set_from_flat_data_page(i, torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g))
    return pool


def storage_config(manager: Manager | None, *, tp_rank=0, tp_size=1, mla=False,
                   page_first=False, model="org/test-model", **extra) -> HiCacheStorageConfig:
    cfg = {"backend_name": "orbitkv", "module_path": "orbitkv.sglang",
           "class_name": "OrbitKVStorage", "interface_v1": 1}
    if manager is not None:
        cfg["socket"] = manager.socket_path
    cfg.update(extra)
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=True,
        is_page_first_layout=page_first, model_name=model, extra_config=cfg,
    )


@pytest.fixture
def sglang_manager(start_manager) -> Manager:
    return start_manager(pool_size="64mib")
