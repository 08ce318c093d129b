"""`kv_connector_extra_config` of the kvpd store connector, validated at engine startup."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpd.connectors.store_folder import StoreConfigError

GB = 1 << 30
KNOWN_KEYS = ("store_path", "dram_cache_gb", "capacity_gb", "io_threads")


@dataclass(frozen=True, slots=True)
class StoreSettings:
    store_path: str
    dram_cache_gb: float = 0.5
    capacity_gb: float | None = None  # None: no disk budget
    io_threads: int = 4

    @property
    def dram_bytes(self) -> int:
        return int(self.dram_cache_gb * GB)

    @property
    def capacity_bytes(self) -> int | None:
        return None if self.capacity_gb is None else int(self.capacity_gb * GB)


def _number(key: str, value: Any, *, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StoreConfigError(f"kv_connector_extra_config.{key} must be a number, got {value!r}.")
    if value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise StoreConfigError(
            f"kv_connector_extra_config.{key} must be {op} {minimum:g}, got {value!r}."
        )
    return float(value)


def parse_settings(extra: Mapping[str, Any] | None) -> StoreSettings:
    """Validate the extra config: unknown keys and bad values are errors, with the fix."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(KNOWN_KEYS))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise StoreConfigError(
            "KvpdStoreConnector: unknown kv_connector_extra_config key(s) "
            f"{', '.join(hints)}. Known keys: {', '.join(KNOWN_KEYS)}."
        )
    path = extra.get("store_path")
    if not isinstance(path, str) or not path:
        raise StoreConfigError(
            "KvpdStoreConnector needs kv_connector_extra_config.store_path, the shared store "
            "folder (profile: `kv: {kvpd_store: {path: <folder>}}`)."
        )
    dram = _number("dram_cache_gb", extra.get("dram_cache_gb", 0.5), minimum=0, strict=False)
    cap = extra.get("capacity_gb")
    capacity = None if cap is None else _number("capacity_gb", cap, minimum=0, strict=True)
    threads = extra.get("io_threads", 4)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise StoreConfigError(
            f"kv_connector_extra_config.io_threads must be an integer >= 1, got {threads!r}."
        )
    return StoreSettings(path, dram, capacity, threads)
