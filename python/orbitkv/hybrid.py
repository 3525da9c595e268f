"""Hybrid models: the model description (``orbitkv/model_description.h``) in Python.

A hybrid model stores more than one kind of state per prefix. Its description
lists storage groups, each tagged by kind:

- ``FULL_ATTENTION``: every block of the prefix [0, P) is needed;
- ``SLIDING_WINDOW`` of W tokens: only the blocks covering [P - W, P);
- ``RECURRENT`` (conv / SSM state): one checkpoint of the state after exactly
  P tokens, taken every N tokens or at given positions.

Each group has a name, the bytes of one block (or one checkpoint), its block
size in tokens (a multiple of the key chain's ``key_block_tokens``) and the
layout group (``storage_group``) whose objects hold it. :meth:`ModelDescription.validate`
refuses what the Manager refuses, with the same message; :meth:`canonical_bytes`
and :meth:`fingerprint` are byte for byte those of ``src/recovery``, and so are
the object keys (:func:`group_mask`, :func:`object_key`): the key of a piece is
its chain key XOR the group's mask, ``SHA-256("orbitkv/recovery/group-mask/v1\\0"
|| u8 kind || u32le len(name) || name)``. tests/python/test_hybrid.py checks all
of it against the C++ library.

The mappings turn an engine's own cache description into one:
:func:`from_vllm_kv_cache_config` (vLLM 0.33's ``KVCacheConfig`` with
``FullAttentionSpec`` / ``SlidingWindowSpec`` / ``MambaSpec`` groups) and
:func:`from_sglang_pools` (SGLang 0.5.23 HiCache v2 pools with their
``ALL_PAGES`` / ``TRAILING_PAGES`` hit policies). Neither imports the engine.

With the Manager: ``Client.register_instance(..., model=description)``. The
engine publishes each piece in its storage group under the *plain* chain key
that names the prefix ending where the piece ends (:func:`block_key_index`,
:func:`checkpoint_key_index`); the Manager masks it (:func:`object_key` is what
it stores under, for tools and tests; engines do not call it). A query of the
chain returns the recovery plan (``QueryResult.prefix_tokens``, ``.pieces``),
and ``restore(blocks=...)`` indexes ``.pieces``.
"""

from __future__ import annotations

import enum
import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence


class GroupKind(enum.IntEnum):
    FULL_ATTENTION = 1
    SLIDING_WINDOW = 2
    RECURRENT = 3


_KIND_NAMES = {1: "full attention", 2: "sliding window", 3: "recurrent"}

MAX_MODEL_GROUPS = 64
MAX_STORAGE_GROUPS = 64
MAX_GROUP_NAME_BYTES = 128
MAX_BLOCK_TOKENS = 1 << 20
MAX_SEQUENCE_TOKENS = 1 << 32
MAX_PIECE_BYTES = 1 << 36
MAX_CHECKPOINT_POSITIONS = 1 << 16

_GROUP_MASK_DOMAIN = b"orbitkv/recovery/group-mask/v1\0"
_CANONICAL_MAGIC = b"OKVMODEL"


@dataclass
class GroupDescription:
    name: str
    kind: int
    storage_group: int
    block_tokens: int
    bytes: int
    window_tokens: int = 0
    checkpoint_interval_tokens: int = 0
    checkpoint_positions: List[int] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "kind": int(self.kind),
            "storage_group": self.storage_group,
            "block_tokens": self.block_tokens,
            "bytes": self.bytes,
            "window_tokens": self.window_tokens,
            "checkpoint_interval_tokens": self.checkpoint_interval_tokens,
            "checkpoint_positions": list(self.checkpoint_positions),
        }


@dataclass
class ModelDescription:
    key_block_tokens: int
    groups: List[GroupDescription] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"key_block_tokens": self.key_block_tokens,
                "groups": [g.to_dict() for g in self.groups]}

    @staticmethod
    def from_dict(d: Dict[str, Any]) -> "ModelDescription":
        """The inverse of :meth:`to_dict` (e.g. a description recorded in JSON)."""
        return ModelDescription(int(d["key_block_tokens"]), [
            GroupDescription(g["name"], GroupKind(int(g["kind"])), int(g["storage_group"]),
                             int(g["block_tokens"]), int(g["bytes"]),
                             int(g.get("window_tokens", 0)),
                             int(g.get("checkpoint_interval_tokens", 0)),
                             [int(p) for p in g.get("checkpoint_positions", [])])
            for g in d["groups"]])

    def validate(self, field: str = "model") -> None:
        """Raises ValueError with the C++ message (field first) for a bad description."""
        err = _validate(self, field)
        if err:
            raise ValueError(err)

    def canonical_bytes(self) -> bytes:
        """The canonical encoding (version 1), groups sorted by name."""
        self.validate()
        out = [_CANONICAL_MAGIC, struct.pack("<HQI", 1, self.key_block_tokens, len(self.groups))]
        for g in sorted(self.groups, key=lambda g: g.name.encode()):
            name = g.name.encode()
            out.append(struct.pack("<I", len(name)) + name)
            out.append(struct.pack("<BIQQQQI", int(g.kind), g.storage_group, g.block_tokens,
                                   g.bytes, g.window_tokens, g.checkpoint_interval_tokens,
                                   len(g.checkpoint_positions)))
            out.append(b"".join(struct.pack("<Q", p) for p in g.checkpoint_positions))
        return b"".join(out)

    def fingerprint(self) -> bytes:
        """SHA-256 of the canonical bytes: what keeps namespaces of different models apart."""
        return hashlib.sha256(self.canonical_bytes()).digest()


# ---- validation (src/recovery/model_description.cc, rule for rule) -------------


def _printable(name: bytes) -> str:
    out = []
    for c in name[:64]:
        out.append(chr(c) if 0x20 <= c < 0x7F and c not in (0x22, 0x5C) else f"\\x{c:02x}")
    return "".join(out) + ("..." if len(name) > 64 else "")


def _uint(v: Any, f: str) -> Optional[str]:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"{f}: {v!r} is not an integer"
    if not 0 <= v < 1 << 64:
        return f"{f}: {v} is outside [0, 2^64)"
    return None


def _validate_recurrent(g: GroupDescription, f: str) -> Optional[str]:
    interval, positions = g.checkpoint_interval_tokens != 0, len(g.checkpoint_positions) > 0
    if interval == positions:
        return (f"{f}.checkpoint_interval_tokens: "
                + ("set together with checkpoint_positions (give exactly one)" if interval else
                   "neither it nor checkpoint_positions is set (a recurrent group needs its "
                   "checkpoint schedule)"))
    if interval:
        n = g.checkpoint_interval_tokens
        if n > MAX_SEQUENCE_TOKENS:
            return (f"{f}.checkpoint_interval_tokens: {n} is larger than the limit "
                    f"{MAX_SEQUENCE_TOKENS}")
        if n % g.block_tokens:
            return (f"{f}.checkpoint_interval_tokens: {n} is off the block grid (not a multiple "
                    f"of block_tokens {g.block_tokens})")
        return None
    if len(g.checkpoint_positions) > MAX_CHECKPOINT_POSITIONS:
        return (f"{f}.checkpoint_positions: {len(g.checkpoint_positions)} positions, more than "
                f"the limit {MAX_CHECKPOINT_POSITIONS}")
    prev = 0
    for i, p in enumerate(g.checkpoint_positions):
        fi = f"{f}.checkpoint_positions[{i}]"
        err = _uint(p, fi)
        if err:
            return err
        if p == 0 or p > MAX_SEQUENCE_TOKENS:
            return f"{fi}: {p} is outside (0, {MAX_SEQUENCE_TOKENS}]"
        if p % g.block_tokens:
            return (f"{fi}: {p} is off the block grid (not a multiple of block_tokens "
                    f"{g.block_tokens})")
        if p <= prev:
            return f"{fi}: {p} does not ascend (the one before is {prev})"
        prev = p
    return None


def _validate_group(d: ModelDescription, g: GroupDescription, f: str) -> Optional[str]:
    if not isinstance(g.name, str):
        return f"{f}.name: {g.name!r} is not a string"
    for attr in ("kind", "storage_group", "block_tokens", "bytes", "window_tokens",
                 "checkpoint_interval_tokens"):
        err = _uint(getattr(g, attr), f"{f}.{attr}")
        if err:
            return err
    name = g.name.encode()
    if not name:
        return f"{f}.name: empty (every group needs a name)"
    if len(name) > MAX_GROUP_NAME_BYTES:
        return f"{f}.name: {len(name)} bytes, longer than the limit {MAX_GROUP_NAME_BYTES}"
    if any(c <= 0x20 or c >= 0x7F for c in name):
        return f'{f}.name: "{_printable(name)}": only printable ASCII without spaces'
    kind = int(g.kind)
    if kind not in _KIND_NAMES:
        return f"{f}.kind: unknown kind {kind}"
    if g.storage_group >= MAX_STORAGE_GROUPS:
        return f"{f}.storage_group: {g.storage_group} is not below the limit {MAX_STORAGE_GROUPS}"
    if g.block_tokens == 0 or g.block_tokens > MAX_BLOCK_TOKENS:
        return f"{f}.block_tokens: {g.block_tokens} is outside [1, {MAX_BLOCK_TOKENS}]"
    if g.block_tokens % d.key_block_tokens:
        return (f"{f}.block_tokens: {g.block_tokens} is not a multiple of key_block_tokens "
                f"{d.key_block_tokens}")
    if g.bytes == 0 or g.bytes > MAX_PIECE_BYTES:
        return f"{f}.bytes: {g.bytes} is outside [1, {MAX_PIECE_BYTES}]"
    if kind == GroupKind.SLIDING_WINDOW:
        if g.window_tokens == 0:
            return f"{f}.window_tokens: 0 (a window needs tokens)"
        if g.window_tokens > MAX_SEQUENCE_TOKENS:
            return (f"{f}.window_tokens: {g.window_tokens} is larger than the limit "
                    f"{MAX_SEQUENCE_TOKENS}")
    elif g.window_tokens:
        return (f"{f}.window_tokens: set on a {_KIND_NAMES[kind]} group (only sliding-window "
                "groups have one)")
    if kind == GroupKind.RECURRENT:
        return _validate_recurrent(g, f)
    for attr, bad in (("checkpoint_interval_tokens", g.checkpoint_interval_tokens != 0),
                      ("checkpoint_positions", len(g.checkpoint_positions) > 0)):
        if bad:
            return (f"{f}.{attr}: set on a {_KIND_NAMES[kind]} group (only recurrent groups "
                    "have checkpoints)")
    return None


def _validate(d: ModelDescription, f: str) -> Optional[str]:
    err = _uint(d.key_block_tokens, f"{f}.key_block_tokens")
    if err:
        return err
    if d.key_block_tokens == 0 or d.key_block_tokens > MAX_BLOCK_TOKENS:
        return f"{f}.key_block_tokens: {d.key_block_tokens} is outside [1, {MAX_BLOCK_TOKENS}]"
    if not d.groups:
        return f"{f}.groups: no groups (a model stores something)"
    if len(d.groups) > MAX_MODEL_GROUPS:
        return f"{f}.groups: {len(d.groups)} groups, more than the limit {MAX_MODEL_GROUPS}"
    names, storage = set(), set()
    for i, g in enumerate(d.groups):
        gf = f"{f}.groups[{i}]"
        err = _validate_group(d, g, gf)
        if err:
            return err
        if g.name in names:
            return f'{gf}.name: "{g.name}" names two groups'
        if g.storage_group in storage:
            return f"{gf}.storage_group: {g.storage_group} is the storage group of two groups"
        names.add(g.name)
        storage.add(g.storage_group)
    return None


# ---- object keys (src/recovery/object_keys.h) ----------------------------------


def group_mask(group: GroupDescription) -> bytes:
    """The 32-byte mask a group's object keys are XORed with."""
    name = group.name.encode()
    return hashlib.sha256(_GROUP_MASK_DOMAIN + bytes([int(group.kind)])
                          + struct.pack("<I", len(name)) + name).digest()


def object_key(chain_key: bytes, mask: bytes) -> bytes:
    """The object key of a piece named by `chain_key` in the group of `mask`."""
    if len(chain_key) != 32 or len(mask) != 32:
        raise ValueError("object_key: chain keys and masks are 32 bytes")
    return bytes(a ^ b for a, b in zip(chain_key, mask))


def block_key_index(d: ModelDescription, g: GroupDescription, block: int) -> int:
    """The chain index whose key names block `block` of an attention group."""
    return (block + 1) * (g.block_tokens // d.key_block_tokens) - 1


def checkpoint_key_index(d: ModelDescription, position: int) -> int:
    """The chain index whose key names the checkpoint after `position` tokens."""
    return position // d.key_block_tokens - 1


# ---- vLLM 0.33 (vllm.v1.kv_cache_interface) --------------------------------------


def from_vllm_kv_cache_config(kv_cache_config: Any,
                              key_block_tokens: Optional[int] = None) -> ModelDescription:
    """A description of vLLM's KV cache groups (one storage group each, in order).

    - ``FullAttentionSpec`` (and subclasses such as MLA): full attention. One that
      records a ``sliding_window`` is what vLLM makes with the hybrid allocator
      off: every block is kept and vLLM's own hit needs every block, so it stays
      full attention.
    - ``SlidingWindowSpec``: a window of ``sliding_window - 1`` tokens, what vLLM's
      SlidingWindowManager requires before the first new token.
    - ``MambaSpec``: recurrent, a checkpoint at every block boundary (vLLM caches
      Mamba state only with ``mamba_cache_mode="align"``: one state per block).

    A group's bytes are one block of every layer of the group (``page_size_bytes``
    of its spec times its layers) on this rank. ``key_block_tokens`` defaults to
    vLLM's ``hash_block_size``, else the gcd of the groups' block sizes. Other
    spec kinds, and Mamba groups without prefix caching, raise ValueError.
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    groups = list(kv_cache_config.kv_cache_groups)
    if not groups:
        raise ValueError("from_vllm_kv_cache_config: the config has no KV cache groups")
    kb = key_block_tokens or getattr(kv_cache_config, "hash_block_size", None)
    if not kb:
        kb = math.gcd(*[int(g.kv_cache_spec.block_size) for g in groups])
    out = ModelDescription(key_block_tokens=int(kb))
    for i, group in enumerate(groups):
        spec = group.kv_cache_spec
        bytes_ = int(spec.page_size_bytes) * len(group.layer_names)
        bt = int(spec.block_size)
        if isinstance(spec, SlidingWindowSpec):
            window = int(spec.sliding_window) - 1
            if window <= 0:
                raise ValueError(f"vLLM group {i}: sliding_window {spec.sliding_window} keeps no "
                                 "tokens before the next one")
            g = GroupDescription(f"vllm{i}.swa", GroupKind.SLIDING_WINDOW, i, bt, bytes_,
                                 window_tokens=window)
        elif isinstance(spec, FullAttentionSpec):
            g = GroupDescription(f"vllm{i}.attn", GroupKind.FULL_ATTENTION, i, bt, bytes_)
        elif isinstance(spec, MambaSpec):
            if spec.mamba_cache_mode != "align":
                raise ValueError(f"vLLM group {i}: MambaSpec with mamba_cache_mode "
                                 f"{spec.mamba_cache_mode!r} caches no state per block (use "
                                 "'align')")
            g = GroupDescription(f"vllm{i}.mamba", GroupKind.RECURRENT, i, bt, bytes_,
                                 checkpoint_interval_tokens=bt)
        else:
            raise ValueError(f"vLLM group {i}: {type(spec).__name__} has no OrbitKV mapping")
        out.groups.append(g)
    out.validate()
    return out


# ---- SGLang 0.5.23 HiCache v2 pools ----------------------------------------------


@dataclass
class SGLangPool:
    """One HiCache v2 pool as the mapping needs it.

    `name` is the pool's ``PoolName`` (or its string), `hit_policy` its
    ``PoolHitPolicy``, `page_bytes` the bytes of one of its pages, and
    `trailing_pages` the window of a ``TRAILING_PAGES`` pool in pages (how many
    trailing keys SGLang passes for it). `recurrent` marks a TRAILING_PAGES pool
    of recurrent state; by default the pool named ``mamba`` is.
    """

    name: Any
    hit_policy: Any
    page_bytes: int
    trailing_pages: int = 1
    recurrent: Optional[bool] = None

    @classmethod
    def from_transfer(cls, transfer: Any, page_bytes: int) -> "SGLangPool":
        """From an SGLang ``PoolTransfer`` of a lookup: its name and hit policy, and for
        TRAILING_PAGES its keys' count as the window (what batch_exists_v2 is given)."""
        return cls(transfer.name, transfer.hit_policy, page_bytes,
                   trailing_pages=max(1, len(transfer.keys or [])))


def sglang_page_bytes(host_pool: Any) -> int:
    """Bytes of one page of an SGLang host pool (its flat data page, as stored)."""
    dummy = host_pool.get_dummy_flat_data_page()
    return int(dummy.numel() * dummy.element_size())


def from_sglang_pools(pools: Sequence[SGLangPool], page_size: int) -> ModelDescription:
    """A description of SGLang's HiCache v2 pools (one storage group each, in order).

    Pages are ``page_size`` tokens and SGLang keys one page hash per page, so
    ``key_block_tokens`` is ``page_size``. ``ALL_PAGES`` (the ``kv`` pool, or an
    indexer) is full attention. ``TRAILING_PAGES`` needs only the last
    ``trailing_pages`` pages before the hit: a sliding window of
    ``trailing_pages * page_size`` tokens (``swa``), or, for recurrent state
    (``mamba``), a checkpoint at every page boundary. ``BLOCK_GROUPS`` raises
    ValueError.
    """
    out = ModelDescription(key_block_tokens=int(page_size))
    for i, pool in enumerate(pools):
        name = str(getattr(pool.name, "value", pool.name))
        policy = str(getattr(pool.hit_policy, "value", pool.hit_policy))
        if policy == "all_pages":
            g = GroupDescription(name, GroupKind.FULL_ATTENTION, i, page_size, pool.page_bytes)
        elif policy == "trailing_pages":
            recurrent = pool.recurrent if pool.recurrent is not None else name == "mamba"
            if recurrent:
                g = GroupDescription(name, GroupKind.RECURRENT, i, page_size, pool.page_bytes,
                                     checkpoint_interval_tokens=page_size)
            else:
                if pool.trailing_pages < 1:
                    raise ValueError(f"SGLang pool {name!r}: trailing_pages "
                                     f"{pool.trailing_pages} (a window needs a page)")
                g = GroupDescription(name, GroupKind.SLIDING_WINDOW, i, page_size,
                                     pool.page_bytes,
                                     window_tokens=pool.trailing_pages * page_size)
        else:
            raise ValueError(f"SGLang pool {name!r}: hit policy {policy!r} has no OrbitKV mapping")
        out.groups.append(g)
    out.validate()
    return out


__all__: Iterable[str] = [
    "GroupKind", "GroupDescription", "ModelDescription", "group_mask", "object_key",
    "block_key_index", "checkpoint_key_index", "from_vllm_kv_cache_config", "SGLangPool",
    "sglang_page_bytes", "from_sglang_pools",
]
