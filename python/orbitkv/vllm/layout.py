"""vLLM KV cache tensors -> an OrbitKV instance layout (no vLLM import).

One OrbitKV page is one vLLM block. Every layer contributes two slots, its K
and its V block, whether the tensor is the older per-layer
``(2, num_blocks, block_size, heads, head_size)`` or the block-first
``(num_blocks, 2, block_size, heads, head_size)`` one, so both store the same
object and instances of either layout share it; a tensor without a K/V
dimension (``(num_blocks, ...)``, e.g. MLA) is one slot. A slot must be one
dense byte range per block, in any stride order (vLLM's HND/NHD permutations
pass; the namespace keeps the two apart). Offsets and strides come from the tensors'
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
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import orbitkv

# data_ptr range -> HostPages, for tensors made by host_tensor().
_host_lock = threading.Lock()
_host_pages: Dict[int, Tuple[int, "orbitkv.HostPages"]] = {}


def host_tensor(shape: Sequence[int], dtype, name: str = "orbitkv-vllm-kv"):
    """A zeroed CPU tensor of `shape`/`dtype` in a fresh sealed memfd
    (:class:`orbitkv.HostPages`), so the Manager can map it. The memfd stays
    known to :func:`describe_kv_caches` (and alive) until
    :func:`release_host_tensor` or the end of the process: views of the
    tensor (permuted, sliced) find it too."""
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
    with _host_lock:
        _host_pages[flat.data_ptr()] = (nbytes, pages)
    return t


def release_host_tensor(t) -> None:
    """Forgets the memfd of a :func:`host_tensor` (it is freed with the tensor's storage)."""
    base, _ = _find_host_pages(t.data_ptr())
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


def kv_dims(shape: Sequence[int], num_blocks: int) -> Tuple[int, Optional[int]]:
    """(block dimension, K/V dimension or None) of a vLLM KV tensor.

    (2, num_blocks, block_size, heads, head_size) -> (1, 0);
    (num_blocks, 2, block_size, heads, head_size) -> (0, 1);
    any other (num_blocks, ...) -> (0, None), one slot per layer (e.g. MLA).
    """
    if len(shape) == 5 and shape[0] == 2 and shape[1] == num_blocks:
        return 1, 0
    if len(shape) == 5 and shape[0] == num_blocks and shape[1] == 2:
        return 0, 1
    if len(shape) >= 2 and shape[0] == num_blocks:
        return 0, None
    raise ValueError(
        f"KV cache tensor of shape {tuple(shape)}: expected (2, {num_blocks}, ...), "
        f"({num_blocks}, 2, ...) or ({num_blocks}, ...)"
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
        b, kv = kv_dims(shape, num_blocks)
        inner = [d for d in range(len(shape)) if d not in (b, kv)]
        inner_shape = [shape[d] for d in inner]
        if not _dense_span(inner_shape, [stride[d] for d in inner]):
            raise ValueError(
                f"KV cache {name}: shape {shape} strides {stride}: a block is not one dense range"
            )
        per_page = item
        for s_ in inner_shape:
            per_page *= s_
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
        page_stride = stride[b] * item
        for idx in ((0, 1) if kv is not None else (None,)):
            start = t.data_ptr() + (0 if idx is None else idx * stride[kv] * item)
            offset = start - region_base[r]
            last = offset + (num_blocks - 1) * page_stride + per_page
            region_end[r] = max(region_end[r], region_base[r] + last)
            slots.append(SlotInfo(name, () if idx is None else (idx,), r, offset, page_stride, per_page))
    region_bytes = [end - base for base, end in zip(region_base, region_end)]
    for r, alloc in enumerate(region_alloc):
        if alloc is not None and region_bytes[r] > alloc:
            raise ValueError(f"KV cache region {r}: {region_bytes[r]} bytes past its {alloc}-byte memfd")
    if len(slots) > orbitkv.MAX_SLOTS_PER_GROUP:
        raise ValueError(
            f"{len(slots)} KV slots per block > OrbitKV's {orbitkv.MAX_SLOTS_PER_GROUP}"
        )
    return KVLayout(device, num_blocks, slots, region_bytes, host, handles)
