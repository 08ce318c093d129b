"""Store counters as vLLM KV connector stats: logged periodically and exported on /metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

# stats key -> (Prometheus counter name, help). prometheus_client appends `_total`.
COUNTERS = {
    "hit_blocks": ("vllm:kvpd_store_hit_blocks", "KV blocks loaded from the kvpd store."),
    "miss_blocks": (
        "vllm:kvpd_store_miss_blocks",
        "Prompt blocks beyond vLLM's prefix cache not found in the kvpd store, or failing to load.",
    ),
    "corrupt_blocks": (
        "vllm:kvpd_store_corrupt_blocks",
        "kvpd store block files rejected by the header or checksum check and removed.",
    ),
    "saved_blocks": ("vllm:kvpd_store_saved_blocks", "KV blocks newly written to the kvpd store."),
    "bytes_read": ("vllm:kvpd_store_read_bytes", "Payload bytes read from the kvpd store disk."),
    "bytes_written": (
        "vllm:kvpd_store_written_bytes",
        "Payload bytes written to the kvpd store disk.",
    ),
    "load_seconds": ("vllm:kvpd_store_load_seconds", "Time spent loading KV from the store."),
    "save_seconds": ("vllm:kvpd_store_save_seconds", "Time spent saving KV to the store."),
    "evicted_blocks": (
        "vllm:kvpd_store_evicted_blocks",
        "Block files removed to keep the kvpd store under capacity_gb.",
    ),
}


@dataclass
class KvpdStoreStats(KVConnectorStats):
    """Counter deltas since the last report; workers and the scheduler add theirs up."""

    def reset(self) -> None:
        self.data: dict[str, float] = {}

    def add(self, **deltas: float) -> None:
        for k, v in deltas.items():
            if v:
                self.data[k] = self.data.get(k, 0) + v

    def aggregate(self, other: KVConnectorStats) -> KvpdStoreStats:
        self.add(**other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvpdStorePromMetrics(KVConnectorPromMetrics):
    """One Prometheus counter per store counter, labelled per engine like vLLM's own."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters: dict[str, dict[int, Any]] = {}
        for key, (name, doc) in COUNTERS.items():
            counter = self._counter_cls(name=name, documentation=doc, labelnames=labelnames)
            self.counters[key] = {
                idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()
            }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            per_engine = self.counters.get(key)
            if per_engine and value and engine_idx in per_engine:
                per_engine[engine_idx].inc(value)
