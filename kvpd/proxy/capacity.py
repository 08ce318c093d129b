"""Each backend's prefix-cache capacity, learned from the engine at run time.

The plan sizes the prefix index from the KV memory the profile gives (--prefix-capacity-
tokens), but the engine decides its real block count only when it starts (what is left after
the weights and activations, the block size it settled on). vLLM reports both on /metrics as
the labels of `vllm:cache_config_info` (num_gpu_blocks, block_size; the CPU build and
vLLM-Ascend alike, since the metric is vLLM's own); a server that hosts several DP engines
reports their sum on every engine's line, which is what that backend holds. So once a
backend answers, its index holds num_gpu_blocks x block_size tokens, and the configured figure
stays for a backend that has not answered or answered something unusable.

What an engine reports is untrusted: the figures must be plain decimal integers within
bounds, and a body that is too large, a missing metric or a bad value leaves the capacity as
it was. A backend that answered is asked again only after it was found down (a restarted
engine may have been given other memory) and every REFRESH_S seconds; one that did not answer,
every RETRY_S seconds."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Literal

from kvpd.proxy.hostpool import fetch
from kvpd.proxy.upstream import UpstreamError

if TYPE_CHECKING:
    from kvpd.proxy.backends import Backend, BackendPool
    from kvpd.proxy.cache_aware import CacheAware

log = logging.getLogger("kvpd.proxy")

CapacitySource = Literal["configured", "engine"]
RETRY_S = 5.0  # while some backend has not answered
REFRESH_S = 300.0
MAX_BODY = 8 << 20  # a vLLM /metrics page is tens of KB
MAX_LINE = 16 << 10
MAX_BLOCK_SIZE = 1 << 16  # tokens a block; vLLM's are 16 to 1024
MAX_TOKENS = 1 << 40  # no cache holds a trillion tokens
_INFO = b"vllm:cache_config_info{"
_LABEL = re.compile(rb'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\\n]|\\.)*)"')
_DECIMAL = re.compile(rb"[0-9]{1,13}")


def _label_int(labels: dict[bytes, bytes], name: bytes, top: int) -> int | None:
    raw = labels.get(name)
    if raw is None or _DECIMAL.fullmatch(raw) is None:
        return None  # "None" before the engine sized its cache, or not a number at all
    value = int(raw)
    return value if 1 <= value <= top else None


def parse_capacity(body: bytes) -> tuple[int, int] | None:
    """(num_gpu_blocks, block_size) from the first usable `vllm:cache_config_info` sample of
    a Prometheus text page; None if there is none."""
    if len(body) > MAX_BODY:
        return None
    for line in body.splitlines():
        if not line.startswith(_INFO) or len(line) > MAX_LINE:
            continue
        labels = dict(_LABEL.findall(line[len(_INFO) : line.rfind(b"}")]))
        block = _label_int(labels, b"block_size", MAX_BLOCK_SIZE)
        blocks = _label_int(labels, b"num_gpu_blocks", MAX_TOKENS)
        if block is not None and blocks is not None and blocks * block <= MAX_TOKENS:
            return blocks, block
    return None


class CapacityLearner:
    """Asks the engines of the pools that route by cache for their cache size."""

    def __init__(self, pools: list[BackendPool], auth_header: bytes) -> None:
        self.pools = [p for p in pools if p.policy is not None]
        self.auth_header = auth_header
        self.learned: dict[tuple[str, str], int] = {}  # (role, name) -> its downs when asked

    async def run(self) -> None:
        while True:
            pending = await self.refresh()
            await asyncio.sleep(RETRY_S if pending else REFRESH_S)
            if not pending:
                self.learned.clear()  # every REFRESH_S: ask everyone again

    async def refresh(self) -> bool:
        """Ask every backend that has not answered since it was last found down; whether
        some are left (unreachable or not usable now)."""
        pending = False
        for pool in self.pools:
            assert pool.policy is not None
            for backend in pool.backends:
                key = (pool.role, backend.name)
                if self.learned.get(key) == backend.transitions["unhealthy"]:
                    continue
                if not backend.usable or not await self._ask(pool.role, pool.policy, backend):
                    pending = True
        return pending

    async def _ask(self, role: str, policy: CacheAware, backend: Backend) -> bool:
        downs = backend.transitions["unhealthy"]
        try:
            # a connection of its own, closed after: a rare fetch holds no idle connection
            resp = await fetch(backend.pool, b"GET", b"/metrics", b"", 5.0,
                               b"Connection: close\r\n" + self.auth_header)  # fmt: skip
        except UpstreamError:
            return False
        # It answered: whether or not that told its capacity, it is asked again only after
        # it was down or in REFRESH_S (an engine without the metric says the same each time).
        self.learned[(role, backend.name)] = downs
        found = parse_capacity(resp.body) if resp.status == 200 else None
        if found is None:
            log.debug("%s %s: no usable vllm:cache_config_info on /metrics (HTTP %d)",
                      role, backend.name, resp.status)  # fmt: skip
            return True
        blocks, block = found
        if policy.set_capacity(backend, blocks * block, "engine"):
            log.info("%s %s: prefix index of %d tokens (the engine's %d blocks of %d)",
                     role, backend.name, blocks * block, blocks, block)  # fmt: skip
        return True
