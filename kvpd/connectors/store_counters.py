"""Cumulative counters of one store object, read by the connector's stats."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class StoreCounters:
    """Cumulative counters of one store object (thread safe through `add`)."""

    hits: int = 0  # blocks served (DRAM or disk)
    dram_hits: int = 0
    misses: int = 0  # blocks asked for and not served (absent or corrupt)
    corrupt: int = 0  # block files rejected by the header or checksum check, then removed
    bytes_read: int = 0  # payload bytes read from disk
    bytes_written: int = 0  # payload bytes written to disk
    blocks_written: int = 0
    evicted: int = 0  # block files removed to stay under the disk budget
    read_s: float = 0.0
    write_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}
