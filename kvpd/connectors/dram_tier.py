"""The per-process DRAM tier in front of the block files."""

from __future__ import annotations

import threading
from collections import OrderedDict


class DramTier:
    """A byte-budgeted LRU of verified block payloads, private to one process."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.used = 0
        self._items: OrderedDict[bytes, bytes | bytearray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | bytearray | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: bytes, value: bytes | bytearray) -> None:
        if len(value) > self.capacity:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= len(old)
            self._items[key] = value
            self.used += len(value)
            while self.used > self.capacity:
                _, dropped = self._items.popitem(last=False)
                self.used -= len(dropped)

    def discard(self, key: bytes) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= len(old)

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)
