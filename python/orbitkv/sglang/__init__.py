"""OrbitKV as SGLang's HiCache L3 storage backend.

Enable it in SGLang with the dynamic backend factory::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name":"orbitkv",
        "module_path":"orbitkv.sglang","class_name":"OrbitKVStorage","interface_v1":1,
        "socket":"/run/orbitkv.sock"}'

SGLang's factory calls ``OrbitKVStorage(storage_config, kwargs)`` and then
registers its host pool(s); each pool becomes one OrbitKV host instance (its own
namespace, one storage group) backed by a bounded staging region that the
Manager shares (a sealed memfd). Pages move pool <-> staging with one copy;
see :mod:`orbitkv.sglang.storage` for why not zero copy, the namespaces and
the extra-config keys.

Importing this module checks the installed SGLang: it must be a tested release
(:data:`TESTED_SGLANG_VERSIONS`) with the storage interface this adapter is
written against; anything else raises ImportError saying what was found.
``ORBITKV_SGLANG_ALLOW_UNTESTED=1`` lets another version through when its
interface checks out.
"""

from __future__ import annotations

import importlib.metadata
import os

TESTED_SGLANG_VERSIONS = ("0.5.23",)


def _check_sglang() -> str:
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            "orbitkv.sglang needs SGLang installed (tested: "
            f"{', '.join(TESTED_SGLANG_VERSIONS)}); no 'sglang' distribution was found"
        ) from None
    try:
        from sglang.srt.mem_cache import hicache_storage as hs
    except Exception as e:  # an ImportError deep inside sglang, or a broken install
        raise ImportError(
            f"orbitkv.sglang: sglang {version} is installed but its storage interface "
            f"(sglang.srt.mem_cache.hicache_storage) does not import: {e}"
        ) from e
    missing = [
        name
        for name in ("HiCacheStorage", "HiCacheStorageConfig", "PoolTransfer",
                     "PoolHitPolicy", "PoolTransferResult", "PoolName")
        if not hasattr(hs, name)
    ]
    missing += [
        f"HiCacheStorage.{m}"
        for m in ("batch_get_v1", "batch_set_v1", "batch_exists_v2", "register_mem_host_pool_v2")
        if not hasattr(getattr(hs, "HiCacheStorage", object), m)
    ]
    if missing:
        raise ImportError(
            f"orbitkv.sglang: sglang {version} lacks {', '.join(missing)}; this adapter is "
            f"written against sglang {', '.join(TESTED_SGLANG_VERSIONS)}"
        )
    if version not in TESTED_SGLANG_VERSIONS and os.environ.get(
        "ORBITKV_SGLANG_ALLOW_UNTESTED"
    ) != "1":
        raise ImportError(
            f"orbitkv.sglang is tested with sglang {', '.join(TESTED_SGLANG_VERSIONS)}, "
            f"found {version}; set ORBITKV_SGLANG_ALLOW_UNTESTED=1 to try it anyway"
        )
    return version


SGLANG_VERSION = _check_sglang()

from .storage import OrbitKVStorage, page_key, pool_namespace  # noqa: E402

__all__ = [
    "OrbitKVStorage",
    "SGLANG_VERSION",
    "TESTED_SGLANG_VERSIONS",
    "page_key",
    "pool_namespace",
]
