"""vLLM KV cache tensors -> an OrbitKV instance layout (no vLLM import).

One OrbitKV page is one vLLM block. Every layer contributes two slots, its K
and its V block, whether the tensor is the older per-layer
``(2, num_blocks, block_size, heads, head_size)`` or the block-first
``(num_blocks, 2, block_size, heads, head_size)`` one, so both store the same
object and instances of either layout share it; a tensor without a K/V
dimension (``(num_blocks, ...)``, e.g. MLA) is one slot. A slot must be one
dense byte range per block, in any stride order (vLLM's HND/NHD permutations
pass; the namespace keeps the two apart).

Regions, offsets, strides and CUDA IPC handles come from
:func:`orbitkv.torch.derive_layout` over views of the tensors in that
canonical form (K/V dimension first, block dimension next, the rest in
memory order), so they follow the tensors' real pointers and strides. Host
tensors must live in memory the Manager can map: :func:`host_tensor`.
"""

from __future__ import annotations

import dataclasses
from typing import List, Mapping, Optional, Sequence, Tuple

import orbitkv


def host_tensor(shape: Sequence[int], dtype):
    """A zeroed CPU tensor of `shape`/`dtype` in a sealed memfd
    (orbitkv.torch.host_tensors), which the Manager can map; views of it
    (permuted, sliced) register too."""
    from orbitkv.torch import host_tensors

    return host_tensors(tuple(shape), dtype)[0]


@dataclasses.dataclass
class SlotInfo:
    layer: str
    index: Tuple[int, ...]  # (0,) K, (1,) V; () for a tensor without a K/V dimension
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
    tensor_layout: object  # orbitkv.torch.TensorLayout: layout, regions, handles

    @property
    def region_bytes(self) -> List[int]:
        return list(self.tensor_layout.layout.region_bytes)

    @property
    def host_regions(self) -> list:
        return self.tensor_layout.host_regions

    @property
    def ipc_handles(self) -> List[bytes]:
        return self.tensor_layout.ipc_handles

    def instance_layout(self) -> "orbitkv.InstanceLayout":
        return self.tensor_layout.layout

    def block_bytes(self) -> int:
        return sum(s.bytes_per_page for s in self.slots)


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


def _canonical(t, num_blocks: int):
    """(view, page_dim): the K/V dimension first, then blocks, then the other
    dimensions in memory order (largest stride first)."""
    b, kv = kv_dims(tuple(t.shape), num_blocks)
    lead = [kv, b] if kv is not None else [b]
    rest = [d for d in range(t.dim()) if d not in lead]
    rest.sort(key=lambda d: -t.stride(d))
    return t.permute(*lead, *rest), len(lead) - 1


def describe_kv_caches(kv_caches: Mapping[str, object], num_blocks: int) -> KVLayout:
    """The KVLayout of vLLM's per-layer KV cache tensors (layer name -> tensor,
    in the order vLLM gives them). All tensors must be on one device."""
    from orbitkv.torch import derive_layout

    if not kv_caches:
        raise ValueError("register_kv_caches: no KV cache tensors")
    if num_blocks <= 0:
        raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
    names = list(kv_caches)
    views, dims = zip(*(_canonical(kv_caches[n], num_blocks) for n in names))
    try:
        tl = derive_layout(list(views), list(dims))
    except ValueError as e:
        raise ValueError(f"KV cache tensors {names[:2]}...: {e}") from None
    if len(tl.slot_ids) > orbitkv.MAX_SLOTS_PER_GROUP:
        raise ValueError(
            f"{len(tl.slot_ids)} KV slots per block > OrbitKV's {orbitkv.MAX_SLOTS_PER_GROUP}"
        )
    group = tl.layout.groups[0]
    slots = [
        SlotInfo(names[ti], tuple(lead), s.region, s.offset, s.page_stride, s.bytes_per_page)
        for (ti, lead), s in zip(tl.slot_ids, group.slots)
    ]
    return KVLayout(tl.device, num_blocks, slots, tl)
