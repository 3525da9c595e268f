"""OrbitKV: the engine side of the KV-cache Manager, for Python.

An engine keeps its KV pages in host memory regions (:class:`HostPages`, sealed
memfds), describes them with an :class:`InstanceLayout`, registers them with the
Manager through a :class:`Client`, then publishes pages under 32-byte block
keys, queries key chains and restores hits into its pages::

    import numpy as np
    import orbitkv

    layout = orbitkv.split_layout(num_pages=64, slot_bytes=[4096, 4096])
    regions = orbitkv.allocate_regions(layout)
    with orbitkv.Client("/run/orbitkv.sock") as client:
        inst = client.register_instance("llama-8b/bf16/tp1", 0, "host", layout, regions)
        view = regions[0].numpy()          # writable, shares the engine's memory
        client.publish(inst, 0, [key], [page])
        q = client.query(inst, 0, [key])
        results = client.restore(inst, q.query, list(range(q.prefix)), dest_pages)

torch tensors (CUDA or CPU) register through :mod:`orbitkv.torch`, and
:mod:`orbitkv.transformers` is a prefix cache for transformers models; neither
is imported here, so ``import orbitkv`` does not need (or import) torch. The
wheel bundles the Manager: the ``orbitkv-cache-manager`` console script, or
:func:`manager_binary` for its path.

Every Manager error raises a subclass of :class:`OrbitKVError` (one per
Status code); malformed arguments detected locally raise ``ValueError`` /
``TypeError``. Blocking calls release the GIL.
"""

from __future__ import annotations

from typing import List, Sequence, Union

from . import _orbitkv
from ._manager import manager_binary
from ._orbitkv import (  # noqa: F401  (re-exports)
    KEY_BYTES,
    MAX_GROUPS,
    MAX_PAGES,
    MAX_REGIONS,
    MAX_SLOT_BYTES,
    MAX_SLOTS_PER_GROUP,
    AlreadyExistsError,
    BlockResult,
    BusyError,
    Client,
    CorruptionError,
    DeadlineExceededError,
    FailedPreconditionError,
    GroupLayout,
    HostPages,
    InstanceLayout,
    InternalError,
    InvalidArgumentError,
    NoSpaceError,
    NotFoundError,
    OrbitCancelledError,
    OrbitIOError,
    OrbitKVError,
    PermissionDeniedError,
    PublishResult,
    QueryResult,
    ResourceExhaustedError,
    SlotLayout,
    UnavailableError,
    default_socket_path,
)

__version__ = "0.1.0"

__all__ = [
    "KEY_BYTES",
    "MAX_GROUPS",
    "MAX_PAGES",
    "MAX_REGIONS",
    "MAX_SLOT_BYTES",
    "MAX_SLOTS_PER_GROUP",
    "AlreadyExistsError",
    "BlockResult",
    "BusyError",
    "Client",
    "CorruptionError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "GroupLayout",
    "HostPages",
    "InstanceLayout",
    "InternalError",
    "InvalidArgumentError",
    "NoSpaceError",
    "NotFoundError",
    "OrbitCancelledError",
    "OrbitIOError",
    "OrbitKVError",
    "PermissionDeniedError",
    "PublishResult",
    "QueryResult",
    "ResourceExhaustedError",
    "SlotLayout",
    "UnavailableError",
    "allocate_regions",
    "default_socket_path",
    "manager_binary",
    "page_first_layout",
    "slot_view",
    "split_layout",
]

SlotBytes = Union[int, Sequence[int]]


def _slot_list(slot_bytes: SlotBytes) -> List[int]:
    if isinstance(slot_bytes, int):
        sizes = [slot_bytes]
    else:
        sizes = [int(b) for b in slot_bytes]
    if not sizes:
        raise ValueError("slot_bytes must name at least one slot")
    for b in sizes:
        if b <= 0:
            raise ValueError(f"slot sizes must be > 0, got {b}")
    return sizes


def split_layout(num_pages: int, slot_bytes: SlotBytes, group_id: int = 0) -> InstanceLayout:
    """A split layout: one region per slot (e.g. one tensor per layer).

    Slot ``s`` of page ``p`` is ``slot_bytes[s]`` bytes at offset
    ``p * slot_bytes[s]`` of region ``s``; region ``s`` is
    ``num_pages * slot_bytes[s]`` bytes. ``slot_bytes`` is a list of sizes (or
    one int for a single slot); sizes need not be multiples of 512 or 4096.
    """
    sizes = _slot_list(slot_bytes)
    slots = [
        SlotLayout(slot_id=s, region=s, offset=0, page_stride=b, bytes_per_page=b)
        for s, b in enumerate(sizes)
    ]
    group = GroupLayout(group_id=group_id, num_slots=len(sizes), slot_bytes=sizes, slots=slots)
    return InstanceLayout(
        num_pages=num_pages, region_bytes=[num_pages * b for b in sizes], groups=[group]
    )


def page_first_layout(num_pages: int, slot_bytes: SlotBytes, group_id: int = 0) -> InstanceLayout:
    """A page-first layout: one region; each page holds all its slots back to back.

    The page size is ``sum(slot_bytes)``; slot ``s`` of page ``p`` is at
    ``p * page_size + sum(slot_bytes[:s])`` of region 0.
    """
    sizes = _slot_list(slot_bytes)
    page_bytes = sum(sizes)
    slots = []
    offset = 0
    for s, b in enumerate(sizes):
        slots.append(
            SlotLayout(slot_id=s, region=0, offset=offset, page_stride=page_bytes, bytes_per_page=b)
        )
        offset += b
    group = GroupLayout(group_id=group_id, num_slots=len(sizes), slot_bytes=sizes, slots=slots)
    return InstanceLayout(
        num_pages=num_pages, region_bytes=[num_pages * page_bytes], groups=[group]
    )


def allocate_regions(layout: InstanceLayout, name: str = "orbitkv-pages") -> List[HostPages]:
    """One :class:`HostPages` per ``layout.region_bytes`` entry, in order: the
    ``regions`` argument of :meth:`Client.register_instance`."""
    return [HostPages(int(size), name) for size in layout.region_bytes]


def slot_view(regions: Sequence[HostPages], slot: SlotLayout, page: int) -> memoryview:
    """A writable memoryview of slot ``slot`` of page ``page``: ``slot.bytes_per_page``
    bytes of ``regions[slot.region]`` at ``slot.page_offset(page)``. Release it
    (or let it go) before closing the region."""
    start = slot.page_offset(page)
    return regions[slot.region].view()[start : start + slot.bytes_per_page]
