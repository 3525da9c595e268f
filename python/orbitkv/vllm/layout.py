"""vLLM KV cache tensors -> an OrbitKV instance layout (no vLLM import).

One OrbitKV page is one vLLM block. Every layer contributes two slots, its K
and its V block, whether the tensor is the older per-layer
``(2, num_blocks, block_size, heads, head_size)`` or the block-first
``(num_blocks, 2, block_size, heads, head_size)`` one, so both store the same
object and instances of either layout share it; a tensor without a K/V
dimension (``(num_blocks, ...)``, e.g. MLA) is one slot. A slot must be one
dense byte range per block, in any stride order (vLLM's HND/NHD permutations
pass; the namespace keeps the two apart).

A Mamba layer (a recurrent KV cache group: conv and SSM state, one state per
vLLM block) contributes one slot per state, whatever its dtype: vLLM 0.33
hands the connector one raw page view per layer, ``(num_blocks, 1, 1, C)``
int8 whose C bytes per block are the states packed in order (what
``MambaBase.bind_kv_cache`` slices), and a list of state tensors
``(num_blocks, *shape)`` (what the layer works on) is taken too; both give
the same slots, byte views of each state in each block.

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
    group: int  # the KV cache group (OrbitKV storage group) of the layer
    layer: str
    index: Tuple[int, ...]  # (0,) K, (1,) V; () without a K/V dimension; (i,) Mamba state i
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
    tensor_layout: object  # orbitkv.torch.TensorLayout (or the groups' merged): layout, regions

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

    def block_bytes(self, group: Optional[int] = None) -> int:
        """Bytes of one block (of one group's layers when `group` is given)."""
        return sum(s.bytes_per_page for s in self.slots if group is None or s.group == group)

    def group_slot_bytes(self) -> List[List[int]]:
        """Per group, in group order, its slots' bytes per block."""
        n = 1 + max(s.group for s in self.slots)
        return [[s.bytes_per_page for s in self.slots if s.group == g] for g in range(n)]


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


def describe_kv_caches(kv_caches: Mapping[str, object], num_blocks: int,
                       layer_groups: Optional[Mapping[str, int]] = None,
                       group_states: Optional[Mapping[int, Sequence[int]]] = None) -> KVLayout:
    """The KVLayout of vLLM's per-layer KV cache tensors (layer name -> tensor,
    in the order vLLM gives them). All tensors must be on one device.

    `layer_groups` (layer name -> KV cache group, for hybrid models) makes one
    OrbitKV group per KV cache group, its slots those of the group's layers.
    The groups may share tensors, as vLLM's hybrid allocator does (a layer of
    each group sees one tensor; a block id belongs to one group at a time):
    regions are per allocation, whichever groups' slots lie in them.

    `group_states` (KV cache group -> the bytes of each state a layer of that
    recurrent group packs in a block, in order: vLLM's ``MambaSpec`` shapes x
    dtypes) makes each layer of such a group one slot per state."""
    if not kv_caches:
        raise ValueError("register_kv_caches: no KV cache tensors")
    if num_blocks <= 0:
        raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
    names = list(kv_caches)
    of = {n: 0 for n in names} if layer_groups is None else dict(layer_groups)
    missing = [n for n in names if n not in of]
    if missing:
        raise ValueError(f"KV cache tensors of layers in no KV cache group: {missing[:3]}")
    n_groups = 1 + max(of.values())  # every group the mapping names needs tensors
    per_group = []
    for g in range(n_groups):
        mine = [n for n in names if of[n] == g]
        if not mine:
            raise ValueError(f"KV cache group {g} has no KV cache tensor")
        states = (group_states or {}).get(g)
        per_group.append(_derive(kv_caches, mine, num_blocks, states))
    if layer_groups is None:
        tl, owners = per_group[0]
        slots = [SlotInfo(0, *_owner(owners, ti, lead), s.region, s.offset, s.page_stride,
                          s.bytes_per_page)
                 for (ti, lead), s in zip(tl.slot_ids, tl.layout.groups[0].slots)]
        return KVLayout(tl.device, num_blocks, slots, tl)
    return _merge(per_group, num_blocks)


def _owner(owners, ti: int, lead) -> Tuple[str, Tuple[int, ...]]:
    """(layer, SlotInfo.index) of slot `lead` of the group's derived tensor `ti`."""
    layer, state = owners[ti]
    return layer, (tuple(lead) if state is None else (state,))


def _derive(kv_caches: Mapping[str, object], names: Sequence[str], num_blocks: int,
            states: Optional[Sequence[int]] = None):
    """(TensorLayout, owners) of one group's layers; owners[i] is the (layer,
    state index or None) of the i-th tensor derived."""
    from orbitkv.torch import derive_layout

    if states is None:
        views, dims = zip(*(_canonical(kv_caches[n], num_blocks) for n in names))
        owners = [(n, None) for n in names]
    else:
        views, owners = [], []
        for n in names:
            for i, v in enumerate(state_views(kv_caches[n], num_blocks, states, n)):
                views.append(v)
                owners.append((n, i))
        dims = [0] * len(views)
    try:
        tl = derive_layout(list(views), list(dims))
    except ValueError as e:
        raise ValueError(f"KV cache tensors {list(names)[:2]}...: {e}") from None
    if len(tl.slot_ids) > orbitkv.MAX_SLOTS_PER_GROUP:
        raise ValueError(
            f"{len(tl.slot_ids)} KV slots per block > OrbitKV's {orbitkv.MAX_SLOTS_PER_GROUP}"
        )
    return tl, owners


def _block_bytes_view(t, num_blocks: int, what: str):
    """`t` (num_blocks, ...) as a (num_blocks, bytes) uint8 view of the same
    memory; ValueError when a block is not one dense byte range."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.dim() < 1 or t.shape[0] != num_blocks:
        raise ValueError(f"{what} of shape {tuple(t.shape)}: expected ({num_blocks}, ...)")
    expected = 1
    for n, st in reversed(list(zip(t.shape[1:], t.stride()[1:]))):
        if n != 1 and st != expected:
            raise ValueError(f"{what} strides {t.stride()}: a block's state is not one dense "
                             "byte range")
        expected *= n
    # A dense inner part: the same memory as (num_blocks, elements), then bytes.
    flat = t.as_strided((num_blocks, expected), (t.stride(0), 1))
    return flat.view(torch.uint8)


def state_views(t, num_blocks: int, state_bytes: Sequence[int], layer: str = "Mamba layer"):
    """Per state, a (num_blocks, bytes) uint8 view of a Mamba layer's KV cache:
    a raw page view whose blocks hold the states packed in order (vLLM 0.33's
    ``(num_blocks, 1, 1, sum(state_bytes))`` int8), or a list of state tensors
    ``(num_blocks, *shape)`` of any dtypes. ValueError names what does not fit."""
    sizes = [int(b) for b in state_bytes]
    if isinstance(t, (list, tuple)):
        if len(t) != len(sizes):
            raise ValueError(f"{layer}: {len(t)} state tensors, the KV cache spec has "
                             f"{len(sizes)}")
        out = []
        for i, (s, n) in enumerate(zip(t, sizes)):
            v = _block_bytes_view(s, num_blocks, f"{layer} state {i}")
            if v.shape[1] != n:
                raise ValueError(f"{layer} state {i}: {v.shape[1]} bytes per block, the KV "
                                 f"cache spec {n}")
            out.append(v)
        return out
    v = _block_bytes_view(t, num_blocks, layer)
    if v.shape[1] != sum(sizes):
        raise ValueError(f"{layer}: {v.shape[1]} bytes per block, the KV cache spec's states "
                         f"{sizes} are {sum(sizes)}")
    out, off = [], 0
    for n in sizes:
        out.append(v[:, off:off + n])
        off += n
    return out


@dataclasses.dataclass
class _Merged:
    """The groups' TensorLayouts over one region list (what KVLayout reads)."""

    layout: "orbitkv.InstanceLayout"
    host_regions: list
    ipc_handles: List[bytes]


def _merge(per_group, num_blocks: int) -> KVLayout:
    """One instance layout of the groups' derived layouts: a region per
    allocation (regions of one allocation in several groups are one)."""
    keys, regions, region_bytes, slots, groups = {}, [], [], [], []
    device = per_group[0][0].device
    for g, (tl, owners) in enumerate(per_group):
        if tl.device != device:
            raise ValueError(f"KV cache group {g} is on {tl.device}, group 0 on {device}")
        remap = []
        for reg, size in zip(tl.regions, tl.layout.region_bytes):
            r = keys.get(reg.key)
            if r is None:
                r = keys[reg.key] = len(regions)
                regions.append(reg)
                region_bytes.append(0)
            region_bytes[r] = max(region_bytes[r], int(size))
            remap.append(r)
        mine = []
        for (ti, lead), s in zip(tl.slot_ids, tl.layout.groups[0].slots):
            info = SlotInfo(g, *_owner(owners, ti, lead), remap[s.region], s.offset,
                            s.page_stride, s.bytes_per_page)
            slots.append(info)
            mine.append(info)
        groups.append(orbitkv.GroupLayout(
            group_id=g, num_slots=len(mine), slot_bytes=[s.bytes_per_page for s in mine],
            slots=[orbitkv.SlotLayout(slot_id=i, region=s.region, offset=s.offset,
                                      page_stride=s.page_stride, bytes_per_page=s.bytes_per_page)
                   for i, s in enumerate(mine)]))
    layout = orbitkv.InstanceLayout(num_pages=num_blocks, region_bytes=region_bytes,
                                    groups=groups)
    layout.validate()
    merged = _Merged(layout,
                     [r.host_pages for r in regions] if device == "host" else [],
                     [r.ipc_handle for r in regions] if device != "host" else [])
    return KVLayout(device, num_blocks, slots, merged)


def probe_layout(group_slot_bytes: Sequence[Sequence[int]]) -> "orbitkv.InstanceLayout":
    """A one-page layout with one group per entry of `group_slot_bytes` (the
    group's slot sizes), all in one region, page first: what a scheduler-side
    probe of a hybrid namespace registers (never written)."""
    groups, offset = [], 0
    for g, sizes in enumerate(group_slot_bytes):
        slots = []
        for i, b in enumerate(sizes):
            slots.append(orbitkv.SlotLayout(slot_id=i, region=0, offset=offset,
                                            page_stride=b, bytes_per_page=b))
            offset += b
        groups.append(orbitkv.GroupLayout(group_id=g, num_slots=len(sizes),
                                          slot_bytes=list(sizes), slots=slots))
    return orbitkv.InstanceLayout(num_pages=1, region_bytes=[offset], groups=groups)
