"""vLLM KV cache tensors -> an OrbitKV instance layout (no vLLM import).

One OrbitKV page is one vLLM block. Every layer tensor contributes one slot per
index of the dimensions in front of its block dimension (K and V of the older
per-layer ``(2, num_blocks, block_size, heads, head_size)`` layout; one slot
for the block-first ``(num_blocks, 2, block_size, heads, head_size)`` and the
cross-layer ``(num_blocks, layers, 2, ...)`` ones). The dimensions behind the
block dimension must tile one dense byte range per block, in any stride order
(vLLM's HND/NHD permutations pass). Offsets and strides come from the tensors'
real ``data_ptr()`` and ``stride()``, never from assumed shapes.

Regions are the memory the tensors live in: for CUDA, the cudaMalloc
allocation behind each storage (IPC handle from torch, region from the
allocation base so the Manager can map it); for host tensors, the
:class:`orbitkv.HostPages` memfd they were allocated in (see
:func:`host_tensor`). Slots of tensors sharing a region share it.

Only torch is imported, lazily (the module loads without it).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import orbitkv

# data_ptr range -> HostPages, for tensors made by host_tensor().
_host_lock = threading.Lock()
_host_pages: Dict[int, Tuple[int, "orbitkv.HostPages"]] = {}


def host_tensor(shape: Sequence[int], dtype, name: str = "orbitkv-vllm-kv"):
    """A zeroed CPU tensor of `shape`/`dtype` in a fresh sealed memfd
    (:class:`orbitkv.HostPages`), so the Manager can map it. The memfd lives
    as long as the tensor's storage does."""
    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize
    for s in shape:
        nbytes *= int(s)
    if nbytes <= 0:
        raise ValueError(f"host_tensor: empty shape {tuple(shape)}")
    pages = orbitkv.HostPages(nbytes, name)
    flat = torch.frombuffer(pages, dtype=torch.uint8)
    t = flat.view(dtype).view(*shape)
    base = flat.data_ptr()
    with _host_lock:
        _host_pages[base] = (nbytes, pages)
    weakref.finalize(flat, _forget_host_pages, base)
    return t


def _forget_host_pages(base: int) -> None:
    with _host_lock:
        _host_pages.pop(base, None)


def _find_host_pages(ptr: int) -> Tuple[int, "orbitkv.HostPages"]:
    with _host_lock:
        for base, (size, pages) in _host_pages.items():
            if base <= ptr < base + size and not pages.closed:
                return base, pages
    raise ValueError(
        "host KV cache tensors must live in OrbitKV host pages (orbitkv.vllm.layout.host_tensor): "
        f"address {ptr:#x} is in none"
    )


@dataclasses.dataclass
class SlotInfo:
    layer: str
    index: Tuple[int, ...]  # indices of the dimensions before the block dimension
    region: int
    offset: int  # bytes from the region base to block 0 of this slot
    page_stride: int
    bytes_per_page: int


@dataclasses.dataclass
class KVLayout:
    """A registered-to-be instance: device, layout, and what backs its regions."""

    device: str  # "host" or "cuda:N"
    num_blocks: int
    slots: List[SlotInfo]
    region_bytes: List[int]
    host_regions: List["orbitkv.HostPages"]  # device "host": one per region
    ipc_handles: List[bytes]  # device "cuda:N": one per region

    def instance_layout(self) -> "orbitkv.InstanceLayout":
        slots = [
            orbitkv.SlotLayout(
                slot_id=i,
                region=s.region,
                offset=s.offset,
                page_stride=s.page_stride,
                bytes_per_page=s.bytes_per_page,
            )
            for i, s in enumerate(self.slots)
        ]
        group = orbitkv.GroupLayout(
            group_id=0,
            num_slots=len(slots),
            slot_bytes=[s.bytes_per_page for s in self.slots],
            slots=slots,
        )
        return orbitkv.InstanceLayout(
            num_pages=self.num_blocks, region_bytes=list(self.region_bytes), groups=[group]
        )

    def block_bytes(self) -> int:
        return sum(s.bytes_per_page for s in self.slots)

    def fingerprint_parts(self) -> List[str]:
        """What a reader of the stored bytes must agree on: slot order and sizes."""
        return [f"{s.layer}{list(s.index)}:{s.bytes_per_page}" for s in self.slots]


def block_dim(shape: Sequence[int], num_blocks: int) -> int:
    """The block dimension of a vLLM KV tensor: 1 for (2, num_blocks, ...), 0 for
    (num_blocks, ...). Anything else is a ValueError."""
    if len(shape) >= 3 and shape[0] == 2 and shape[1] == num_blocks:
        return 1
    if len(shape) >= 2 and shape[0] == num_blocks:
        return 0
    raise ValueError(
        f"KV cache tensor of shape {tuple(shape)}: no block dimension of size {num_blocks} "
        "at position 0 or 1 (expected (2, num_blocks, ...) or (num_blocks, ...))"
    )


def _dense_span(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """True if these dimensions cover one dense range (any order of strides)."""
    dims = sorted((st, sz) for sz, st in zip(shape, stride) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def _region_of(t) -> Tuple[object, int, int, Optional[bytes], Optional["orbitkv.HostPages"]]:
    """(region key, base address, allocation bytes, ipc handle, host pages) of tensor t."""
    if t.device.type == "cuda":
        storage = t.untyped_storage()
        # (device, handle, storage bytes, offset of the storage in its allocation, ...)
        info = storage._share_cuda_()
        handle, offset = bytes(info[1]), int(info[3])
        base = storage.data_ptr() - offset
        return ("cuda", handle), base, None, handle, None
    if t.device.type == "cpu":
        base, pages = _find_host_pages(t.data_ptr())
        return ("host", base), base, pages.size, None, pages
    raise ValueError(f"KV cache tensor on {t.device}: only CUDA and host tensors can be registered")


def describe_kv_caches(kv_caches: Mapping[str, object], num_blocks: int) -> KVLayout:
    """The KVLayout of vLLM's per-layer KV cache tensors (layer name -> tensor,
    in the order vLLM gives them). All tensors must be on one device."""
    if not kv_caches:
        raise ValueError("register_kv_caches: no KV cache tensors")
    if num_blocks <= 0:
        raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
    devices = {str(t.device) for t in kv_caches.values()}
    if len(devices) != 1:
        raise ValueError(f"KV cache tensors on several devices: {sorted(devices)}")
    dev = next(iter(devices))
    device = "host" if dev == "cpu" else (dev if ":" in dev else dev + ":0")

    regions: Dict[object, int] = {}
    region_base: List[int] = []
    region_end: List[int] = []
    region_alloc: List[Optional[int]] = []
    handles: List[bytes] = []
    host: List["orbitkv.HostPages"] = []
    slots: List[SlotInfo] = []
    for name, t in kv_caches.items():
        shape, stride, item = tuple(t.shape), tuple(t.stride()), t.element_size()
        b = block_dim(shape, num_blocks)
        inner_shape, inner_stride = shape[b + 1 :], stride[b + 1 :]
        if not _dense_span(inner_shape, inner_stride):
            raise ValueError(
                f"KV cache {name}: shape {shape} strides {stride}: a block is not one dense range"
            )
        per_page = item
        for s in inner_shape:
            per_page *= s
        key, base, alloc, handle, pages = _region_of(t)
        if key not in regions:
            regions[key] = len(region_base)
            region_base.append(base)
            region_end.append(base)
            region_alloc.append(alloc)
            if handle is not None:
                handles.append(handle)
            if pages is not None:
                host.append(pages)
        r = regions[key]
        outer = shape[:b]
        idx_list: List[Tuple[int, ...]] = [()]
        for size in outer:
            idx_list = [i + (j,) for i in idx_list for j in range(size)]
        for idx in idx_list:
            start = t.data_ptr() + sum(i * s for i, s in zip(idx, stride[:b])) * item
            offset = start - region_base[r]
            page_stride = stride[b] * item
            last = offset + (num_blocks - 1) * page_stride + per_page
            region_end[r] = max(region_end[r], region_base[r] + last)
            slots.append(SlotInfo(name, idx, r, offset, page_stride, per_page))
    region_bytes = [end - base for base, end in zip(region_base, region_end)]
    for r, alloc in enumerate(region_alloc):
        if alloc is not None and region_bytes[r] > alloc:
            raise ValueError(f"KV cache region {r}: {region_bytes[r]} bytes past its {alloc}-byte memfd")
    if len(slots) > orbitkv.MAX_SLOTS_PER_GROUP:
        raise ValueError(
            f"{len(slots)} KV slots per block > OrbitKV's {orbitkv.MAX_SLOTS_PER_GROUP}"
        )
    return KVLayout(device, num_blocks, slots, region_bytes, host, handles)
