"""Namespaces and block keys of the vLLM connector (no vLLM import).

A vLLM block hash names a whole token prefix (each hash covers its parent's),
so it maps onto an OrbitKV key chain directly. Keys are 32 bytes: the block
hash and the request's cache_salt go through SHA-256 under a domain tag, so
hashes of any length (sha256_cbor's 32 bytes, 8-byte xxhash) are accepted and
two salts never share a key even if vLLM's hash left the salt out.

The namespace (one per instance in the Manager) holds what makes stored bytes
interchangeable: the model, KV dtype, block size, the KV layout fingerprint
(per layer: kind, heads, head size, dtype, and the physical cache layout) and
the TP/PP rank and size. Scheduler and worker compute the same string from
the same vLLM configuration; the worker core takes it as given.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, List, Optional, Sequence

KEY_DOMAIN = b"orbitkv/vllm/block/v1\0"
NAMESPACE_VERSION = "orbitkv-vllm/v1"


def block_key(block_hash: bytes, cache_salt: Optional[str] = None) -> bytes:
    """The 32-byte OrbitKV key of one vLLM block hash under `cache_salt`."""
    if not isinstance(block_hash, (bytes, bytearray, memoryview)):
        raise TypeError(f"block hash must be bytes, not {type(block_hash).__name__}")
    h = hashlib.sha256(KEY_DOMAIN)
    salt = (cache_salt or "").encode()
    h.update(len(salt).to_bytes(4, "little"))
    h.update(salt)
    h.update(bytes(block_hash))
    return h.digest()


def block_keys(block_hashes: Iterable[bytes], cache_salt: Optional[str] = None) -> List[bytes]:
    return [block_key(b, cache_salt) for b in block_hashes]


def layout_fingerprint(parts: Sequence[str]) -> str:
    """A short stable digest of the layout description `parts` (16 hex digits)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def namespace(
    model: str,
    kv_dtype: str,
    block_size: int,
    layout: str,
    tp_rank: int,
    tp_size: int,
    pp_rank: int = 0,
    pp_size: int = 1,
) -> str:
    """The Manager namespace of one (TP, PP) rank's KV cache."""
    if not model:
        raise ValueError("namespace: model must not be empty")
    if block_size <= 0:
        raise ValueError(f"namespace: block_size must be > 0, got {block_size}")
    if not 0 <= tp_rank < tp_size or not 0 <= pp_rank < pp_size:
        raise ValueError(
            f"namespace: rank out of range (tp {tp_rank}/{tp_size}, pp {pp_rank}/{pp_size})"
        )
    return (
        f"{NAMESPACE_VERSION}|model={model}|dtype={kv_dtype}|block={block_size}"
        f"|layout={layout}|tp={tp_rank}/{tp_size}|pp={pp_rank}/{pp_size}"
    )
