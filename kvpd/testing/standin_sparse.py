"""The stand-in decode's sparse KV offload planner: kvpd's native core, called per request as
vLLM-Ascend's decode calls it (part of kvpd's STAND-IN engine: no NPU, no indexer, no host pool).

vLLM-Ascend's decode with `sparse_kv_offload_config` keeps only a top-k hot buffer of each
request's KV on the NPU. At every decode step its SparseKVOffloadManager plans, per request row,
which of the indexer's top-k tokens are resident and which to load (`lru_resident_compact`), and
the copy descriptors of those loads from the host pool (`compute_lru_resident_addrs`); with
`KVPD_SPARSE_PLANNER=kvpd` that planner is `kvpd.native.ascend_planner`. The stand-in runs the
same two functions on a row of its own for every request, one call of each per generated token:
its top-k is the newest `index_topk` tokens of the context (a sliding window: the first step
loads the window, each later one the newest token), and its descriptors are address arithmetic
over base addresses nothing is copied to. The planner is the real one, imported from the node
bundle on PYTHONPATH: where the plan says kvpd's planner runs (`KVPD_SPARSE_PLANNER=kvpd`) and
it cannot be imported, the stand-in does not start (`StartError`), it never plans with
something else.

Imports the standard library; NumPy and kvpd's native core only in `start`.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
from dataclasses import dataclass
from typing import Any

ENV = "KVPD_SPARSE_PLANNER"  # as kvpd/plan/sparse_planner.py renders it for the decode
# Base addresses of a host pool (K, V) and a hot buffer (K, V) that do not exist: the
# descriptors are only computed, never used, so any addresses far apart serve.
SRC_K, SRC_V, DST_K, DST_V = 1 << 40, 1 << 42, 1 << 44, 1 << 46
# The row count and longest context vLLM uses when the command line leaves them unset.
DEFAULT_ROWS, DEFAULT_MAX_TOKENS = 256, 1 << 17


class StartError(Exception):
    """The plan's sparse planner cannot run here: the stand-in exits at start with this."""


@dataclass(frozen=True)
class Spec:
    """One decode's planner sizes, as vLLM-Ascend's manager sizes its own."""

    topk: int  # the indexer's top-k (model.index_topk)
    capacity: int  # hot-buffer slots per row (sparse_kv_offload_config.topk_buffer_size)
    rows: int  # requests planned at once (--max-num-seqs)
    max_tokens: int  # longest context (--max-model-len)
    block: int  # KV block size
    tok_k: int  # bytes of one token's K (latent) in the host pool
    tok_v: int  # bytes of one token's V (rope)


def _arg(real: list[str], flag: str) -> str | None:
    for i, a in enumerate(real[:-1]):
        if a == flag:
            return real[i + 1]
    return None


def configured(real: list[str]) -> dict[str, Any] | None:
    """The real command line's `sparse_kv_offload_config` when it enables sparse offload."""
    raw = _arg(real, "--additional-config")
    try:
        cfg = (json.loads(raw) if raw else {}).get("sparse_kv_offload_config")
    except (ValueError, AttributeError):
        return None
    return cfg if isinstance(cfg, dict) and cfg.get("enabled") else None


def spec_of(real: list[str], cfg: dict[str, Any], topk: int, token_bytes: str, block: int) -> Spec:
    try:
        tok_k, tok_v = (int(x) for x in token_bytes.split(","))
    except ValueError:
        raise StartError(f"--sparse-token-bytes must be K,V (bytes), got {token_bytes!r}") from None
    capacity = int(cfg.get("topk_buffer_size") or 2 * topk)
    rows = int(_arg(real, "--max-num-seqs") or DEFAULT_ROWS)
    max_tokens = int(_arg(real, "--max-model-len") or DEFAULT_MAX_TOKENS)
    return Spec(topk, capacity, rows, max_tokens, block, tok_k, tok_v)


def start(
    real: list[str], topk: int | None, token_bytes: str, block: int
) -> tuple[Planner | None, dict[str, str], str]:
    """A decode's planner from its real command line and environment: (the planner to call per
    request, or None when the plan runs vLLM-Ascend's own; the labels of its info gauge; the
    start line). Raises StartError when the plan runs kvpd's planner and it cannot load."""
    cfg = configured(real)
    assert cfg is not None, "start() is for a decode with sparse offload"
    want = os.environ.get(ENV, "").strip().lower()
    if want != "kvpd":  # the plugin leaves vLLM-Ascend's own planner: a JIT build, no stand-in
        why = f"{ENV}={want}" if want else f"{ENV} unset"
        line = f"sparse KV offload planner: vLLM-Ascend's own ({why}); the stand-in plans nothing"
        return None, {"planner": "upstream", "isa": "", "machine": platform.machine()}, line
    if not topk:
        raise StartError("sparse KV offload with kvpd's planner needs --sparse-topk (index_topk)")
    where = f"{sys.executable} ({platform.machine()}, PYTHONPATH={os.environ.get('PYTHONPATH')})"
    try:
        import numpy as np

        from kvpd.native import ascend_planner as ap
    except ImportError as e:
        raise StartError(
            f"the plan runs kvpd's sparse planner here ({ENV}=kvpd) but {where} cannot import "
            f"it: {e}. The node bundle of this host's engine slot must carry kvpd's native core "
            "for this platform (see the bundle rows of `kvpd status`; NumPy must be installed), "
            "or set decode.sparse_offload.planner: upstream."
        ) from e
    spec = spec_of(real, cfg, topk, token_bytes, block)
    if spec.capacity < spec.topk:
        raise StartError(f"topk_buffer_size {spec.capacity} is smaller than index_topk {topk}")
    planner = Planner(spec, ap, np)
    isa = str(ap.isa_info()["isa"])
    module = str(getattr(sys.modules.get("kvpd.native._ascend_planner"), "__file__", ""))
    labels = {"planner": "kvpd", "isa": isa, "machine": platform.machine(), "module": module}
    line = (
        f"sparse KV offload planner: kvpd's native core ({isa} row planner, "
        f"{platform.machine()}) from {module}; top-k {spec.topk}, {spec.capacity} slots, "
        f"{spec.rows} rows"
    )
    return planner, labels, line


class Planner:
    """kvpd's planner over caller-owned state of `rows` request rows, in upstream's layout."""

    def __init__(self, spec: Spec, ap: Any, np: Any) -> None:
        s, i32 = spec, np.int32
        self.spec, self.ap, self.np = spec, ap, np
        self.req = np.zeros(s.rows, np.int64)
        self.last = np.full(s.rows, -1, np.int64)
        self.topk = np.full((s.rows, s.topk), -1, i32)
        self.stable = np.full(s.rows, s.max_tokens, i32)  # no prefix is dropped
        self.stt = np.full((s.rows, s.capacity), -1, i32)
        self.lru = np.tile(np.arange(s.capacity, dtype=i32), (s.rows, 1))
        self.cur, self.mt, self.ms = (np.zeros((s.rows, s.topk), i32) for _ in range(3))
        self.mc = np.zeros(s.rows, i32)
        # upstream's five workspaces: part of the interface, left untouched by kvpd's core
        self.ws = [np.zeros(shape, i32) for shape in ((1, s.max_tokens), (1, s.max_tokens))]
        self.ws += [np.zeros((1, 3 * s.capacity), i32), np.zeros((1, s.topk), i32)]
        self.ws += [np.zeros(1, i32)]
        per_row = -(-s.max_tokens // s.block)  # each row its own region of the host pool
        self.bt = np.arange(s.rows * per_row, dtype=i32).reshape(s.rows, per_row)
        self.gvas, self.addr = np.zeros(2 * s.topk, np.int64), np.zeros(2 * s.topk, np.int64)
        self.size, self.num = np.zeros(2 * s.topk, i32), np.zeros(1, i32)
        self.free = list(range(s.rows))
        self.cond = threading.Condition()
        self.lock = threading.Lock()  # one planner call at a time (the outputs are shared)
        self.next_id = 0

    def plan(self, context: int, steps: int) -> tuple[int, int]:
        """Plan `steps` decode steps of one request whose context starts at `context` tokens:
        (tokens loaded, copy descriptors). A request waits for a free row, as vLLM queues
        requests beyond --max-num-seqs."""
        with self.cond:
            while not self.free:
                self.cond.wait()
            row = self.free.pop()
            self.next_id += 1
            self.req[row] = self.next_id  # a new request id: the core resets the row
        try:
            loaded = descriptors = 0
            for i in range(steps):
                with self.lock:
                    misses, num = self._step(row, min(context + i, self.spec.max_tokens))
                loaded, descriptors = loaded + misses, descriptors + num
            return loaded, descriptors
        finally:
            with self.cond:
                self.free.append(row)
                self.cond.notify()

    def _step(self, r: int, ctx: int) -> tuple[int, int]:
        s, np = self.spec, self.np
        w = min(s.topk, ctx)
        self.topk[r, :w] = np.arange(ctx - w, ctx, dtype=np.int32)
        self.topk[r, w:] = -1
        state = (self.req, self.last, self.topk, self.stable, self.stt, self.lru, self.cur)
        rows = [a.ctypes.data + r * a.strides[0] for a in (*state, self.mc, self.mt, self.ms)]
        self.ap.lru_resident_compact(
            *rows, *(a.ctypes.data for a in self.ws), 1, s.topk, s.capacity, s.max_tokens, 1, 1
        )
        one = slice(r, r + 1)
        slot0 = r * s.capacity  # the row's part of the hot buffer
        self.ap.compute_lru_resident_addrs(
            self.mc[one], self.mt[one], self.ms[one], self.bt[one], s.block, s.tok_k, s.tok_v,
            SRC_K, SRC_V, DST_K + slot0 * s.tok_k, DST_V + slot0 * s.tok_v, s.capacity, 1,
            self.gvas, self.addr, self.size, self.num,
        )  # fmt: skip
        misses, num = int(self.mc[r]), int(self.num[0])
        self._check(r, misses, num)
        return misses, num

    def _check(self, r: int, misses: int, num: int) -> None:
        """Each K descriptor must read its miss token from the row's block of the host pool."""
        s = self.spec
        toks = self.mt[r, :misses].astype(self.np.int64)
        want = SRC_K + (self.bt[r, toks // s.block] * s.block + toks % s.block) * s.tok_k
        if num != 2 * misses or (self.gvas[:misses] != want).any():
            raise RuntimeError(f"planner descriptors disagree: {num} for {misses} misses")
