"""orbitkv.vllm: OrbitKV as vLLM's KV connector.

``OrbitKVConnector`` (module path ``orbitkv.vllm``) needs vLLM
``SUPPORTED_VLLM`` (checked here: importing this package with another vLLM
raises ImportError naming both versions). Without vLLM installed the package
still imports: the vLLM-free parts (``orbitkv.vllm.worker``, ``.layout``,
``.plan``, ``.keys``, ``.config``) serve hosts that replay recorded plans,
and ``OrbitKVConnector`` raises ImportError saying vLLM is missing.
"""

from __future__ import annotations

SUPPORTED_VLLM = ("0.33",)  # release series the connector is written and tested against
TESTED_VLLM = "0.33.0"


def check_vllm_version(version: str) -> None:
    """Raises ImportError unless `version` is in a supported release series."""
    series = ".".join(version.split(".")[:2])
    if series not in SUPPORTED_VLLM:
        raise ImportError(
            f"orbitkv.vllm.OrbitKVConnector supports vLLM {', '.join(s + '.x' for s in SUPPORTED_VLLM)} "
            f"(tested with {TESTED_VLLM}); this environment has vLLM {version}. "
            "Install a supported vLLM (scripts/vllm_env.sh makes a pinned environment)."
        )


try:
    import vllm as _vllm
except ImportError as _e:  # the vLLM-free parts stay usable
    _missing = _e

    def __getattr__(name: str):
        if name in ("OrbitKVConnector", "OrbitKVConnectorMetadata", "OrbitKVConnectorStats"):
            raise ImportError(
                f"orbitkv.vllm.{name} needs vLLM {TESTED_VLLM}, which is not importable here: {_missing}"
            )
        raise AttributeError(f"module 'orbitkv.vllm' has no attribute {name!r}")

else:
    check_vllm_version(_vllm.__version__)
    from .connector import (  # noqa: F401  (the connector vLLM loads by module path)
        OrbitKVConnector,
        OrbitKVConnectorMetadata,
        OrbitKVConnectorStats,
    )

    __all__ = ["OrbitKVConnector", "OrbitKVConnectorMetadata", "OrbitKVConnectorStats"]
