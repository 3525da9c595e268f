"""orbitkv.torch: torch tensors as an engine instance's KV pages.

``import orbitkv`` never imports torch; this module does (torch >= 2.4).

Stable API (the vLLM and SGLang adapters build on it)::

    reg = orbitkv.torch.register_tensors(client, ns, rank, tensors, page_dim=0)
    reg.publish(keys, pages)          # pages: page indices along page_dim
    q = reg.query(keys)               # QueryResult (prefix, sources, leases)
    results = reg.restore(q.query, blocks, pages)
    reg.unregister()                  # or `with register_tensors(...) as reg:`

    layout = orbitkv.torch.derive_layout(tensors, page_dim)  # what would be registered
    host = orbitkv.torch.host_tensors((num_pages, 2, 16, 8, 128), torch.bfloat16, count=24)

**Pages and slots.** Every tensor has the same number of pages along
``page_dim`` (an int, or one per tensor). Page ``p`` of a tensor is
``t.select(page_dim, p)``; its dimensions after ``page_dim`` must be
contiguous (one byte range per page: "the page dimension's inner part is not
contiguous" otherwise), and each index combination of the dimensions before
``page_dim`` is one slot. So a list of per-layer tensors
``[num_pages, 2, block, heads, dim]`` (page_dim 0) gives one slot per layer;
``[2, num_pages, block, heads, dim]`` (page_dim 1, vLLM's FlashAttention shape)
gives a K and a V slot per layer; one tensor ``[layers, 2, num_pages, ...]``
(page_dim 2) gives ``2 * layers`` slots. Slots are numbered in tensor order,
then row-major over the leading dimensions; ``TensorRegistration.slot_ids``
maps them back. Any strides are accepted as long as the page stride is at
least a page (pages must not overlap) and no two slots start at the same byte.
All tensors must share one dtype and one device.

**CUDA tensors** register as device ``cuda:N`` (N as this process numbers its
GPUs: run the Manager with the same ``CUDA_VISIBLE_DEVICES``). The Manager maps
each allocation through a CUDA IPC handle (``untyped_storage()._share_cuda_()``,
which names the caching allocator's segment and the storage's offset in it);
tensors in one allocation (views, or one big tensor sliced per layer) share one
region that starts at the allocation's base, so offsets of views are exact.
Segments of PyTorch's expandable-segments allocator
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) have no legacy IPC
handle and are refused with that reason. ``publish`` first synchronises the
current CUDA stream of the tensors' device (``sync=False`` skips it when the
caller already did), so the Manager copies finished pages; ``restore``
returns after the Manager's copies completed.

**CPU tensors** register as device ``host``. The Manager can only map host
memory handed over as a sealed memfd, so **arbitrary existing CPU tensors
(torch's allocator, pinned or not, or ``share_memory_()``) cannot be shared**:
allocate them with :func:`host_tensors`, which places them in
:class:`orbitkv.HostPages` (optionally page-locked for fast H2D/D2H copies,
``pin=True``). Registering any other CPU tensor raises ``ValueError`` saying so.

**Lifetime.** A registration holds references to the tensors and their
storages until :meth:`TensorRegistration.unregister` (or ``close`` of its
Client), so the memory cannot be freed or reused under the Manager even when
the caller drops every tensor: ``del`` and garbage collection free nothing
while registered. After unregister the Manager has unmapped the memory and
the references are dropped. A storage freed in place while registered
(``untyped_storage().resize_(0)``, as some sharding code does) is detected
before each publish/restore (its address or size changed) and raises
``RuntimeError`` instead of letting the Manager touch freed memory.

**Storage codec.** ``register_tensors(..., storage_codec="ans", head_dim=128)``
asks the Manager for the namespace's SSD storage codec (``none``, ``ans``,
``fp8``, ``turboquant-4``, ``turboquant-3``; ``""`` takes the Manager's
``--storage-codec``); the element dtype is the tensors' (bfloat16 ``bf16``,
float16 ``fp16``, float8_e4m3fn ``fp8_e4m3fn``; other dtypes send none, which
the lossy codecs refuse) and ``head_dim`` the elements of one (token, head)
vector, the last dimension of a page. The codec is part of the namespace's
identity: instances of one name under different codecs never share objects.

Errors: ``TypeError`` for non-tensors, ``ValueError`` for a wrong device
(mixed devices, CPU tensors not from host_tensors, meta tensors), a
non-contiguous page dimension, overlapping pages, mismatched dtypes or page
counts; the Manager's refusals raise :class:`orbitkv.OrbitKVError` subclasses.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ._orbitkv import (
    Client,
    FailedPreconditionError,
    GroupLayout,
    HostPages,
    InstanceLayout,
    SlotLayout,
)

__all__ = [
    "TensorLayout",
    "TensorRegistration",
    "codec_dtype",
    "derive_layout",
    "host_tensors",
    "register_tensors",
]

CUDA_IPC_HANDLE_BYTES = 64
PageDim = Union[int, Sequence[int]]


# ---- host memory ----------------------------------------------------------------


class _TorchHostPages(HostPages):
    """HostPages behind tensors made by host_tensors; optionally page-locked
    with cudaHostRegister, unregistered before the memory is unmapped. Never
    handed out: the tensors (each holds a buffer export, so a reference) keep
    it alive, and it goes with the last of them."""

    def __init__(self, size: int, name: str, pin: bool):
        super().__init__(size, name)
        probe = torch.frombuffer(self, dtype=torch.uint8, count=1)
        self.address = probe.data_ptr()
        del probe
        self.pinned = False
        if pin:
            if not torch.cuda.is_available():
                raise ValueError("host_tensors(pin=True) needs CUDA (torch.cuda.is_available())")
            err = torch.cuda.cudart().cudaHostRegister(self.address, size, 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of {size} bytes failed: error {int(err)}")
            self.pinned = True

    def _unpin(self) -> None:
        if self.pinned:
            self.pinned = False
            torch.cuda.cudart().cudaHostUnregister(self.address)

    def __del__(self):
        # Runs once no tensor exports the memory any more (each export holds a
        # reference), before the base class unmaps it.
        try:
            self._unpin()
        except Exception:  # interpreter shutdown: nothing left to protect
            pass


_host_pages: Dict[int, "weakref.ref[_TorchHostPages]"] = {}


def _forget(address: int, ref) -> None:
    if _host_pages.get(address) is ref:
        del _host_pages[address]


def _track(pages: _TorchHostPages) -> None:
    address = pages.address
    _host_pages[address] = weakref.ref(pages, lambda r, a=address: _forget(a, r))


def _host_pages_of(t: torch.Tensor) -> Tuple[_TorchHostPages, int]:
    """The HostPages holding all of `t`'s bytes, and t's byte offset in it."""
    lo, hi = _extent(t)
    for address, ref in list(_host_pages.items()):
        pages = ref()
        if pages is None or pages.closed:
            continue
        if address <= lo and hi <= address + pages.size:
            return pages, lo - address
    raise ValueError(
        f"a CPU tensor at {lo:#x} ({tuple(t.shape)}, {t.dtype}) is not in OrbitKV host memory: "
        "arbitrary CPU tensors cannot be shared with the Manager (it maps only sealed memfds); "
        "allocate them with orbitkv.torch.host_tensors()"
    )


def host_tensors(
    shape: Union[Sequence[int], Sequence[Sequence[int]]],
    dtype: torch.dtype,
    count: Optional[int] = None,
    *,
    pin: bool = False,
    name: str = "orbitkv-pages",
) -> List[torch.Tensor]:
    """CPU tensors in memory the Manager can map (one sealed memfd each).

    ``shape`` is one shape (then ``count`` tensors of it, default 1) or a list of
    shapes. The tensors are zero-filled, contiguous and writable; pass them to
    :func:`register_tensors`. ``pin=True`` also page-locks them for CUDA
    (cudaHostRegister), undone when the last tensor of a region is gone.
    Existing CPU tensors cannot be shared; copy into these instead.
    """
    if len(shape) and all(isinstance(d, int) for d in shape):
        shapes = [tuple(int(d) for d in shape)] * (1 if count is None else int(count))
    else:
        if count is not None and count != len(shape):
            raise ValueError(f"count {count} != {len(shape)} shapes")
        shapes = [tuple(int(d) for d in s) for s in shape]
    if not shapes:
        raise ValueError("host_tensors: no tensors asked for")
    itemsize = torch.empty((), dtype=dtype).element_size()
    out = []
    for s in shapes:
        if any(d < 0 for d in s):
            raise ValueError(f"negative dimension in shape {s}")
        nbytes = math.prod(s) * itemsize
        if nbytes == 0:
            raise ValueError(f"shape {s} has no elements")
        pages = _TorchHostPages(nbytes, name, pin)
        _track(pages)
        out.append(torch.frombuffer(pages, dtype=dtype).view(s))
    return out


# ---- layout derivation ------------------------------------------------------------


def _extent(t: torch.Tensor) -> Tuple[int, int]:
    """[first byte, one past the last byte] that `t` can address."""
    es = t.element_size()
    lo = t.data_ptr()
    span = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return lo, lo + (span + 1) * es


@dataclass(frozen=True)
class _Region:
    key: Tuple  # identifies the allocation
    base: int  # address of byte 0 of the region
    ipc_handle: Optional[bytes]  # cuda: the allocation's cudaIpcMemHandle_t
    host_pages: Optional[HostPages]  # host: the memfd


def parse_ipc_handle(handle: bytes) -> bytes:
    """The 64-byte cudaIpcMemHandle_t inside torch's shareable handle: the raw
    64 bytes (older torch), or a version byte, the type byte 'c' (a
    cudaMalloc block) and the 64 bytes (torch 2.11 and later). Type 'e'
    (expandable segments) has no legacy IPC handle."""
    if len(handle) == CUDA_IPC_HANDLE_BYTES:
        return bytes(handle)
    if len(handle) == CUDA_IPC_HANDLE_BYTES + 2 and handle[1:2] == b"c":
        return bytes(handle[2:])
    if len(handle) == CUDA_IPC_HANDLE_BYTES + 1 and handle[0:1] == b"c":
        return bytes(handle[1:])
    if handle[1:2] == b"e" or handle[0:1] == b"e":
        raise ValueError(
            "the tensor lives in an expandable segment (PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True), which has no CUDA IPC handle the Manager can open; "
            "allocate the KV cache with expandable_segments:False"
        )
    raise ValueError(f"unrecognised torch CUDA IPC handle ({len(handle)} bytes)")


def _cuda_region(t: torch.Tensor, seen: Dict[int, Tuple[_Region, int]]) -> Tuple[_Region, int]:
    storage = t.untyped_storage()
    known = seen.get(storage.data_ptr())
    if known is not None:  # another view of a storage already shared
        region, _ = known
        return region, t.data_ptr() - region.base
    shared = storage._share_cuda_()
    # (device, handle, storage bytes, storage offset in the allocation,
    #  ref counter file, ref counter offset, event handle, event sync needed)
    handle, storage_offset = shared[1], int(shared[3])
    if handle is None:
        raise ValueError("a CUDA tensor with no memory (empty storage) cannot be registered")
    raw = parse_ipc_handle(handle)
    # torch counts one consumer per _share_cuda_ and keeps the block alive
    # until it decrements: the Manager is no torch consumer, and the
    # registration itself keeps the storage alive, so give the count back.
    if shared[4] is not None:
        torch.UntypedStorage._release_ipc_counter_cuda(shared[4], int(shared[5]))
    base = storage.data_ptr() - storage_offset
    region = _Region(("cuda", t.device.index, base), base, raw, None)
    seen[storage.data_ptr()] = (region, storage_offset)
    return region, t.data_ptr() - base


def _host_region(t: torch.Tensor) -> Tuple[_Region, int]:
    pages, offset = _host_pages_of(t)
    return _Region(("host", pages.address), pages.address, None, pages), offset


def _device_of(tensors: Sequence[torch.Tensor]) -> str:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"tensors are on several devices: {sorted(str(d) for d in devices)}")
    (dev,) = devices
    if dev.type == "cuda":
        return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
    if dev.type == "cpu":
        return "host"
    raise ValueError(f"tensors on {dev} cannot be registered: only cuda:N and cpu (host) devices")


@dataclass
class TensorLayout:
    """What register_tensors registers: the InstanceLayout, its device, one
    region per allocation, and which tensor/leading index each slot is."""

    device: str
    layout: InstanceLayout
    num_pages: int
    dtype: torch.dtype
    slot_ids: List[Tuple[int, Tuple[int, ...]]]  # slot -> (tensor index, leading index)
    regions: List[_Region]
    ipc_handles: List[bytes]  # cuda: one per region
    host_regions: List[HostPages]  # host: one per region

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over all slots (one block's object payload)."""
        return sum(int(b) for b in self.layout.groups[0].slot_bytes)


def derive_layout(
    tensors: Union[torch.Tensor, Sequence[torch.Tensor]], page_dim: PageDim = 0, group_id: int = 0
) -> TensorLayout:
    """The layout, regions and handles of `tensors` (see the module docstring).

    Does not talk to the Manager; raises ValueError / TypeError for tensors
    that cannot be registered.
    """
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    if not tensors:
        raise ValueError("no tensors to register")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{i}] must be a torch.Tensor, not {type(t).__name__}")
    dims = [page_dim] * len(tensors) if isinstance(page_dim, int) else list(page_dim)
    if len(dims) != len(tensors):
        raise ValueError(f"{len(dims)} page dims for {len(tensors)} tensors")
    device = _device_of(tensors)
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"tensors have different dtypes: {sorted(str(d) for d in dtypes)}")
    (dtype,) = dtypes

    num_pages = None
    regions: List[_Region] = []
    region_index: Dict[Tuple, int] = {}
    region_end: List[int] = []
    slots: List[SlotLayout] = []
    slot_bytes: List[int] = []
    slot_ids: List[Tuple[int, Tuple[int, ...]]] = []
    starts = set()
    shared: Dict[int, Tuple[_Region, int]] = {}
    for i, t in enumerate(tensors):
        what = f"tensors[{i}] {tuple(t.shape)}"
        if t.dim() == 0:
            raise ValueError(f"{what}: a 0-d tensor has no page dimension")
        d = dims[i]
        if not -t.dim() <= d < t.dim():
            raise ValueError(f"{what}: page_dim {d} out of range")
        d %= t.dim()
        pages = t.shape[d]
        if num_pages is None:
            num_pages = pages
        elif pages != num_pages:
            raise ValueError(
                f"{what}: {pages} pages along dim {d}, but tensors[0] has {num_pages} "
                "(every tensor needs the same page count)"
            )
        if pages == 0:
            raise ValueError(f"{what}: no pages along dim {d}")
        inner_shape, inner_stride = t.shape[d + 1 :], t.stride()[d + 1 :]
        expected = 1
        for n, st in reversed(list(zip(inner_shape, inner_stride))):
            if n != 1 and st != expected:
                raise ValueError(
                    f"{what} strides {t.stride()}: the page dimension's inner part (dims after "
                    f"{d}) is not contiguous, so a page is not one byte range; use .contiguous() "
                    "or choose another page_dim"
                )
            expected *= n
        es = t.element_size()
        page_bytes = math.prod(inner_shape) * es
        page_stride = t.stride()[d] * es
        if pages > 1 and page_stride < page_bytes:
            raise ValueError(
                f"{what}: page stride {page_stride} bytes is smaller than a page ({page_bytes} "
                "bytes): pages would overlap"
            )
        region, offset0 = _cuda_region(t, shared) if device != "host" else _host_region(t)
        r = region_index.get(region.key)
        if r is None:
            r = region_index[region.key] = len(regions)
            regions.append(region)
            region_end.append(0)
        lo, hi = _extent(t)
        region_end[r] = max(region_end[r], hi - region.base)
        lead_shape, lead_stride = t.shape[:d], t.stride()[:d]
        for lead in _indices(lead_shape):
            off = offset0 + sum(k * st for k, st in zip(lead, lead_stride)) * es
            if (r, off) in starts:
                raise ValueError(
                    f"{what}[{lead}]: starts at the same byte as another slot (a tensor passed twice?)"
                )
            starts.add((r, off))
            slots.append(
                SlotLayout(
                    slot_id=len(slots),
                    region=r,
                    offset=off,
                    page_stride=page_stride,
                    bytes_per_page=page_bytes,
                )
            )
            slot_bytes.append(page_bytes)
            slot_ids.append((i, tuple(lead)))
    if device == "host":
        region_end = [int(reg.host_pages.size) for reg in regions]
    group = GroupLayout(group_id=group_id, num_slots=len(slots), slot_bytes=slot_bytes, slots=slots)
    layout = InstanceLayout(num_pages=num_pages, region_bytes=region_end, groups=[group])
    layout.validate()
    return TensorLayout(
        device=device,
        layout=layout,
        num_pages=num_pages,
        dtype=dtype,
        slot_ids=slot_ids,
        regions=regions,
        ipc_handles=[reg.ipc_handle for reg in regions] if device != "host" else [],
        host_regions=[reg.host_pages for reg in regions] if device == "host" else [],
    )


def _indices(shape: Sequence[int]) -> Iterable[Tuple[int, ...]]:
    if not shape:
        yield ()
        return
    total = math.prod(shape)
    for flat in range(total):
        idx = []
        for n in reversed(shape):
            idx.append(flat % n)
            flat //= n
        yield tuple(reversed(idx))


# ---- registration -----------------------------------------------------------------


class TensorRegistration:
    """A registered instance over torch tensors. Holds the tensors (and so
    their memory) until unregister(). Methods mirror orbitkv.Client's, with
    the instance and group filled in; page indices are along page_dim."""

    def __init__(self, client: Client, ns: str, rank: int, tl: TensorLayout, tensors,
                 storage_codec: str = "", head_dim: int = 0):
        self.client = client
        self.ns = ns
        self.rank = rank
        self.device = tl.device
        self.layout = tl.layout
        self.num_pages = tl.num_pages
        self.dtype = tl.dtype
        self.group_id = int(tl.layout.groups[0].group_id)
        self.slot_ids = tl.slot_ids
        self.page_bytes = tl.page_bytes
        self.tensors: Tuple[torch.Tensor, ...] = tuple(tensors)
        self._storages = [t.untyped_storage() for t in self.tensors]
        self._fingerprint = [(s.data_ptr(), s.nbytes()) for s in self._storages]
        self._host_regions = tl.host_regions  # keeps the memfds open
        self.storage_codec = storage_codec
        self.instance = client.register_instance(
            ns, rank, tl.device, tl.layout, tl.host_regions, tl.ipc_handles or None,
            storage_codec=storage_codec, kv_dtype=codec_dtype(tl.dtype), head_dim=int(head_dim),
        )

    @property
    def closed(self) -> bool:
        return self.instance is None

    def _check(self) -> int:
        if self.instance is None:
            raise FailedPreconditionError("orbitkv.torch registration is unregistered")
        for i, (s, fp) in enumerate(zip(self._storages, self._fingerprint)):
            if (s.data_ptr(), s.nbytes()) != fp:
                raise RuntimeError(
                    f"the storage of registered tensor {i} was freed or moved in place "
                    f"(was {fp[1]} bytes at {fp[0]:#x}, now {s.nbytes()} at {s.data_ptr():#x}); "
                    "unregister before resizing KV memory"
                )
        return self.instance

    def _sync(self) -> None:
        if self.device != "host":
            torch.cuda.current_stream(torch.device(self.device)).synchronize()

    def publish(self, keys, pages, slot_ids=None, *, sync: bool = True):
        """Stores page pages[i] (every slot) under keys[i]; see Client.publish."""
        inst = self._check()
        if sync:
            self._sync()
        return self.client.publish(inst, self.group_id, keys, [int(p) for p in pages], slot_ids)

    def query(self, keys, ttl_ms: int = 30000):
        return self.client.query(self._check(), self.group_id, keys, ttl_ms)

    def restore(self, query: int, blocks, pages, ticket: int = 0, *, sync: bool = True):
        """Copies blocks[i] of the query's prefix into page pages[i]; returns one
        BlockResult per block. With sync, pending work on the current CUDA
        stream (that may still read the pages) finishes first."""
        inst = self._check()
        if sync:
            self._sync()
        return self.client.restore(inst, query, list(blocks), [int(p) for p in pages], ticket)

    def release_query(self, query: int) -> None:
        self.client.release_query(self._check(), query)

    def prepare(self, keys) -> int:
        return self.client.prepare(self._check(), self.group_id, keys)

    def unregister(self) -> None:
        """Unregisters the instance (the Manager unmaps its memory) and drops
        the references to the tensors. Idempotent; a closed Client already
        unregistered it."""
        if self.instance is None:
            return
        inst, self.instance = self.instance, None
        try:
            if not self.client.closed:
                self.client.unregister_instance(inst)
        finally:
            self.tensors = ()
            self._storages = []
            self._host_regions = []

    close = unregister

    def __enter__(self) -> "TensorRegistration":
        return self

    def __exit__(self, *exc) -> None:
        self.unregister()

    def __repr__(self) -> str:
        state = "unregistered" if self.instance is None else f"instance={self.instance}"
        return (
            f"TensorRegistration({state}, device={self.device!r}, pages={self.num_pages}, "
            f"slots={len(self.slot_ids)}, page_bytes={self.page_bytes})"
        )


_CODEC_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
if hasattr(torch, "float8_e4m3fn"):
    _CODEC_DTYPES[torch.float8_e4m3fn] = "fp8_e4m3fn"


def codec_dtype(dtype: torch.dtype) -> str:
    """The storage codecs' name of `dtype` ("bf16", "fp16", "fp8_e4m3fn"), or ""
    for one they do not describe (float32, ...)."""
    return _CODEC_DTYPES.get(dtype, "")


def register_tensors(
    client: Client,
    ns: str,
    rank: int,
    tensors: Union[torch.Tensor, Sequence[torch.Tensor]],
    page_dim: PageDim = 0,
    group_id: int = 0,
    *,
    storage_codec: str = "",
    head_dim: int = 0,
) -> TensorRegistration:
    """Registers `tensors` as one instance (one storage group) of namespace
    `ns`: device cuda:N for CUDA tensors, host for tensors from host_tensors.
    storage_codec / head_dim: the namespace's SSD storage codec ("" = the
    Manager's --storage-codec) and the elements of one head vector (the lossy
    codecs need it); the dtype is the tensors'. See the module docstring for
    the page/slot rules and lifetimes."""
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    tl = derive_layout(tensors, page_dim, group_id)
    return TensorRegistration(client, ns, rank, tl, tensors, storage_codec, head_dim)
