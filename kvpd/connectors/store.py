"""KvpdStoreConnector: a vLLM v1 KV connector over kvpd's tiered (DRAM + shared disk) store.

Scheduler side: hashes each prompt's full blocks into chained content keys, reports the blocks
the store holds beyond vLLM's own prefix cache as external hits, and plans per step which
blocks the worker loads (hits) and saves (newly complete blocks not yet stored). Worker side:
loads hit blocks into the paged KV cache before the forward pass and writes planned blocks
after it, synchronously, so a save is on disk before the producer's response is returned.
`kv_producer` only saves, `kv_consumer` only loads, `kv_both` does both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvpd.connectors import fault
from kvpd.connectors.blockstore import BlockStore
from kvpd.connectors.hashing import StoreIdentity, chain_keys, describe_layout
from kvpd.connectors.settings import parse_settings
from kvpd.connectors.stats import KvpdStorePromMetrics, KvpdStoreStats
from kvpd.connectors.store_folder import StoreConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under the "vllm" logger so lines reach vLLM's configured handlers and format.
logger = init_logger(f"vllm.{__name__}")


@dataclass
class Transfer:
    """Blocks of one request to move: store keys per TP rank and the paged block ids."""

    req_id: str
    keys: list[list[bytes]]  # [tp_rank][i]
    block_ids: list[int]


@dataclass
class StoreMetadata(KVConnectorMetadata):
    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)


@dataclass
class _Req:
    """Scheduler-side bookkeeping of one live request."""

    keys: list[list[bytes]]  # chain keys of the prompt's full blocks, per TP rank
    loadable: int  # blocks that may be loaded (one prompt token is always recomputed)
    n_hbm: int = 0  # leading blocks vLLM's prefix cache already had
    n_store: int = 0  # leading blocks the store has
    n_load: int = 0  # blocks to load (after allocation)
    load_pending: bool = False
    saved_upto: int = 0  # blocks [0, saved_upto) are in the store or already planned
    block_ids: list[int] = field(default_factory=list)
    logged: bool = False


class KvpdStoreConnector(KVConnectorBase_V1):
    """A persistent prefix cache shared through a folder (see the module docstring)."""

    _cache_hit_source = CacheHitSource.DISK

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        self.settings = parse_settings(cfg.kv_connector_extra_config)
        self._loads = bool(cfg.is_kv_consumer)
        self._saves = bool(cfg.is_kv_producer)
        self._block_size = vllm_config.cache_config.block_size
        layout, dtype, self._block_bytes = describe_layout(kv_cache_config)
        par = vllm_config.parallel_config
        if par.pipeline_parallel_size > 1:
            raise StoreConfigError("KvpdStoreConnector does not support pipeline parallelism.")
        self._identity = StoreIdentity(
            model=str(vllm_config.model_config.model),
            dtype=dtype,
            layout=layout,
            block_size=self._block_size,
            tp_size=par.tensor_parallel_size,
        )
        worker = role == KVConnectorRole.WORKER
        # The scheduler only peeks at headers; the DRAM tier and the disk budget are the
        # worker's (it is the process that moves the bytes).
        self.store = BlockStore(
            self.settings.store_path,
            f"{layout}:dtype={dtype}",
            dram_bytes=self.settings.dram_bytes if worker else 0,
            capacity_bytes=self.settings.capacity_bytes if worker else None,
            io_threads=self.settings.io_threads if worker else 1,
        )
        self._stats = KvpdStoreStats()
        self._last = self.store.counters.snapshot()
        # scheduler state
        self._reqs: dict[str, _Req] = {}
        # worker state
        self._tp_rank = 0
        self._layers: list[torch.Tensor] = []
        self._failed_blocks: set[int] = set()
        # FAULT INJECTION (test only): corrupt loaded blocks after their checksum passed.
        self._fault = fault.from_env() if worker and self._loads else None
        if self._fault is not None:
            logger.warning("kvpd store: FAULT INJECTION %s=%s: loaded KV blocks are corrupted "
                           "on purpose (test only)", fault.ENV, self._fault)  # fmt: skip
        if worker:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            self._tp_rank = get_tensor_model_parallel_rank() if par.tensor_parallel_size > 1 else 0
        elif cfg.kv_load_failure_policy != "recompute" and self._loads:
            # A block that fails its checksum at load time is a miss, not a failed request.
            cfg.kv_load_failure_policy = "recompute"
        logger.info(
            "kvpd store (%s, %s): %s; role %s (load=%s, save=%s); dram %.2f GB, capacity %s, "
            "io_threads %d; %d bytes per block",
            role.name.lower(),
            self._identity.model,
            self.store.root,
            cfg.kv_role,
            self._loads,
            self._saves,
            self.settings.dram_cache_gb,
            "unlimited" if self.settings.capacity_gb is None else f"{self.settings.capacity_gb} GB",
            self.settings.io_threads,
            self._block_bytes,
        )

    # ==== scheduler side =========================================================================

    def _track(self, request: Request) -> _Req | None:
        st = self._reqs.get(request.request_id)
        if st is not None:
            return st
        tokens = request.prompt_token_ids
        # Multimodal, LoRA or embedding prompts: token ids alone do not determine the KV.
        if not tokens or request.mm_features or request.lora_request is not None:
            return None
        n_full = len(tokens) // self._block_size
        keys = [
            chain_keys(self._identity, tokens, tp_rank=r, limit=n_full)
            for r in range(self._identity.tp_size)
        ]
        st = _Req(keys=keys, loadable=(len(tokens) - 1) // self._block_size)
        self._reqs[request.request_id] = st
        return st

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        st = self._track(request)
        if st is None:
            return 0, False
        bs = self._block_size
        st.n_hbm = num_computed_tokens // bs
        n_keys = len(st.keys[0])
        st.n_store = min(self.store.lookup_prefix(ks) for ks in st.keys) if n_keys else 0
        n_ext = 0
        if self._loads and num_computed_tokens % bs == 0:
            n_ext = max(0, min(st.n_store, st.loadable) - st.n_hbm)
        if not st.logged:
            st.logged = True
            logger.info(
                "kvpd store: request %s: total blocks %d, hit hbm %d, hit external %d",
                request.request_id,
                n_keys,
                st.n_hbm,
                n_ext,
            )
            self._stats.add(miss_blocks=max(0, st.loadable - st.n_hbm - n_ext))
        return n_ext * bs, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        st.n_load = num_external_tokens // self._block_size
        st.load_pending = st.n_load > 0
        # Blocks before min(store, hbm+load) are already stored; save the rest once computed.
        st.saved_upto = st.n_store

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = StoreMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            self._plan(new.req_id, st, new.num_computed_tokens + scheduled.get(new.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            done = cached.num_computed_tokens[i] + scheduled.get(req_id, 0)
            self._plan(req_id, st, done, meta)
        return meta

    def _plan(self, req_id: str, st: _Req, computed_after: int, meta: StoreMetadata) -> None:
        if st.load_pending:
            st.load_pending = False
            a, b = st.n_hbm, st.n_hbm + st.n_load
            meta.loads.append(Transfer(req_id, [ks[a:b] for ks in st.keys], st.block_ids[a:b]))
        if not self._saves:
            return
        full = min(len(st.keys[0]), computed_after // self._block_size, len(st.block_ids))
        if full > st.saved_upto:
            a, b = st.saved_upto, full
            meta.saves.append(Transfer(req_id, [ks[a:b] for ks in st.keys], st.block_ids[a:b]))
            st.saved_upto = full

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._reqs.pop(request.request_id, None)
        return False, None

    # ==== worker side ============================================================================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = list(self._kv_cache_config.kv_cache_groups[0].layer_names)
        missing = [n for n in names if n not in kv_caches]
        if missing:
            raise StoreConfigError(f"KvpdStoreConnector: no KV cache tensor for {missing}")
        self._layers = [kv_caches[n] for n in names]
        num_blocks = self._kv_cache_config.num_blocks
        per_block = 0
        for name, t in zip(names, self._layers, strict=True):
            if t.shape[0] != num_blocks:
                raise StoreConfigError(
                    f"KvpdStoreConnector: KV cache of {name} has shape {tuple(t.shape)}, expected "
                    f"the block dimension ({num_blocks}) first."
                )
            per_block += t[0].numel() * t.element_size()
        if per_block != self._block_bytes:
            raise StoreConfigError(
                f"KvpdStoreConnector: {per_block} KV bytes per block in memory but the KV "
                f"cache spec says {self._block_bytes}; this KV layout is not supported."
            )

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StoreMetadata)
        for tr in meta.loads:
            t0 = time.perf_counter()
            keys = tr.keys[self._tp_rank]
            # Blocks are read straight into the rows of one staging tensor (no per-block
            # buffers), then scattered into the paged KV cache.
            buf = torch.empty((len(keys), self._block_bytes), dtype=torch.uint8)
            rows = buf.numpy()
            found = self.store.get_many_into(keys, [memoryview(rows[i]) for i in range(len(keys))])
            ok = [i for i, hit in enumerate(found) if hit]
            failed = [tr.block_ids[i] for i, hit in enumerate(found) if not hit]
            if failed:
                self._failed_blocks.update(failed)
                logger.warning(
                    "kvpd store: request %s: %d of %d blocks failed to load; vLLM recomputes them",
                    tr.req_id,
                    len(failed),
                    len(keys),
                )
            if ok:
                if len(ok) < len(keys):
                    buf = buf[torch.tensor(ok, dtype=torch.long)]
                if self._fault is not None:
                    sizes = [t[0].numel() * t.element_size() for t in self._layers]
                    fault.corrupt(buf.numpy(), self._fault, sizes, self._layers[0].element_size())
                idx = torch.tensor([tr.block_ids[i] for i in ok], dtype=torch.long)
                self._scatter(buf, idx)
            self._stats.add(
                hit_blocks=len(ok),
                miss_blocks=len(failed),
                load_seconds=time.perf_counter() - t0,
            )

    def _scatter(self, buf: torch.Tensor, idx: torch.Tensor) -> None:
        off = 0
        n = buf.shape[0]
        for layer in self._layers:
            size = layer[0].numel() * layer.element_size()
            src = buf[:, off : off + size].contiguous().view(layer.dtype)
            layer.index_copy_(0, idx, src.view(n, *layer.shape[1:]))
            off += size

    def _gather(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[0]
        buf = torch.empty((n, self._block_bytes), dtype=torch.uint8)
        off = 0
        for layer in self._layers:
            size = layer[0].numel() * layer.element_size()
            buf[:, off : off + size] = layer.index_select(0, idx).view(torch.uint8).view(n, size)
            off += size
        return buf

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete inside start_load_kv

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return  # whole blocks are saved after the forward pass, in wait_for_save

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, StoreMetadata)
        for tr in meta.saves:
            t0 = time.perf_counter()
            idx = torch.tensor(tr.block_ids, dtype=torch.long)
            buf = self._gather(idx).numpy()
            keys = tr.keys[self._tp_rank]
            self.store.put_many((keys[i], memoryview(buf[i])) for i in range(len(keys)))
            self._stats.add(save_seconds=time.perf_counter() - t0)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    # ==== stats ==================================================================================

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        now = self.store.counters.snapshot()
        d = {k: now[k] - self._last[k] for k in now}
        self._last = now
        self._stats.add(
            saved_blocks=d["blocks_written"],
            corrupt_blocks=d["corrupt"],
            bytes_read=d["bytes_read"],
            bytes_written=d["bytes_written"],
            evicted_blocks=d["evicted"],
        )
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, KvpdStoreStats()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return KvpdStoreStats(data=dict(data)) if data is not None else KvpdStoreStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics:
        return KvpdStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        self.store.close()
