"""The connector's settings: ``kv_connector_extra_config`` parsed and checked.

Every key is declared once below (name, type, default, meaning); the README's
table is this list. Unknown keys and values of the wrong type raise
``ValueError`` naming the key, when vLLM constructs the connector, so a typo
never silently turns caching off. No vLLM import: the worker core and the
GPU gate use it too.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence

LOAD_POLICIES = ("async", "sync", "off")
SAVE_POLICIES = ("all", "prompt", "off")


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    # Manager endpoint.
    socket_path: str = ""  # "" = the Manager's default socket (orbitkv.default_socket_path())
    start_manager: bool = False  # start orbitkv-cache-manager when none listens on socket_path
    manager_binary: str = ""  # "" = $ORBITKV_MANAGER_BINARY, else orbitkv-cache-manager on PATH
    pool_size: str = "4gb"  # --pool-size of a started Manager
    ssd_cache_path: str = ""  # --ssd-cache-path of a started Manager ("" = no SSD tier)
    ssd_cache_capacity: str = "64gb"  # --ssd-cache-capacity of a started Manager
    manager_args: tuple = ()  # further flags for a started Manager
    manager_start_timeout_s: float = 20.0  # how long a started Manager may take to listen
    # What to load and save.
    load_policy: str = "async"  # async: load beside the forward; sync: before it; off
    save_policy: str = "all"  # all complete blocks, prompt blocks only, or off
    min_hit_blocks: int = 1  # fewer Manager hits than this are not loaded
    # Time bounds.
    query_timeout_ms: int = 200  # one scheduler-side Manager call
    io_timeout_ms: int = 60000  # one worker-side restore / publish
    retry_interval_s: float = 5.0  # after a failed Manager call, no call for this long
    query_ttl_ms: int = 5000  # leases of a worker-side load query
    # Keys.
    model_id: str = ""  # "" = vLLM's model name; set it when instances name one model differently

    @staticmethod
    def from_extra_config(extra: Optional[Mapping[str, Any]]) -> "ConnectorConfig":
        extra = dict(extra or {})
        fields = {f.name: f for f in dataclasses.fields(ConnectorConfig)}
        unknown = sorted(set(extra) - set(fields))
        if unknown:
            raise ValueError(
                f"OrbitKVConnector: unknown kv_connector_extra_config key(s) {unknown}; "
                f"known: {sorted(fields)}"
            )
        values = {}
        for name, value in extra.items():
            default = getattr(ConnectorConfig, name) if name != "manager_args" else ()
            values[name] = _coerce(name, value, default)
        cfg = ConnectorConfig(**values)
        cfg._check()
        return cfg

    def _check(self) -> None:
        if self.load_policy not in LOAD_POLICIES:
            raise ValueError(
                f"OrbitKVConnector: load_policy must be one of {LOAD_POLICIES}, "
                f"got {self.load_policy!r}"
            )
        if self.save_policy not in SAVE_POLICIES:
            raise ValueError(
                f"OrbitKVConnector: save_policy must be one of {SAVE_POLICIES}, "
                f"got {self.save_policy!r}"
            )
        for name in ("min_hit_blocks",):
            if getattr(self, name) < 1:
                raise ValueError(f"OrbitKVConnector: {name} must be >= 1")
        for name in ("query_timeout_ms", "io_timeout_ms", "query_ttl_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"OrbitKVConnector: {name} must be > 0")
        if self.query_ttl_ms > 600000:
            raise ValueError("OrbitKVConnector: query_ttl_ms must be <= 600000")
        for name in ("retry_interval_s", "manager_start_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"OrbitKVConnector: {name} must be >= 0")

    def resolved_socket_path(self) -> str:
        if self.socket_path:
            return self.socket_path
        from orbitkv import default_socket_path

        return default_socket_path()

    def resolved_manager_binary(self) -> str:
        return (
            self.manager_binary
            or os.environ.get("ORBITKV_MANAGER_BINARY", "")
            or "orbitkv-cache-manager"
        )

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["manager_args"] = list(self.manager_args)
        return d


def _coerce(name: str, value: Any, default: Any) -> Any:
    """`value` as the type of `default`, or ValueError naming the key."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise ValueError(f"OrbitKVConnector: {name} must be a boolean, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"OrbitKVConnector: {name} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"OrbitKVConnector: {name} must be an integer, got {value!r}") from None
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"OrbitKVConnector: {name} must be a number, got {value!r}")
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"OrbitKVConnector: {name} must be a number, got {value!r}") from None
    if isinstance(default, tuple):
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ValueError(f"OrbitKVConnector: {name} must be a list of strings, got {value!r}")
        if not all(isinstance(v, str) for v in value):
            raise ValueError(f"OrbitKVConnector: {name} must be a list of strings, got {value!r}")
        return tuple(value)
    if not isinstance(value, str):
        raise ValueError(f"OrbitKVConnector: {name} must be a string, got {value!r}")
    return value
