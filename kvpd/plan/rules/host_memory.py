"""Host memory a plan needs against the `memory_gb` a host declares (pure).

memcache's LocalService maps `dram.size` per rank (every TP x PP rank of an AscendStore group
on the host); UCM's share buffer is a `/dev/shm` file (tmpfs, so host memory) of
`cache_buffer_capacity_gb` per DP rank. A plan whose pools exceed the host's memory fails only
when the engines allocate; the profile says how much the host has, so the plan can say it.
(Sparse-offload host pools are checked in `offload.rule_sparse`.)
"""

from __future__ import annotations

from kvpd.plan.capacity import memcache_dram_need
from kvpd.plan.requirements import ucm_shm_gb
from kvpd.plan.rules.base import Checker
from kvpd.plan.sizing import GiB, parse_size
from kvpd.profile.roles import ENGINE_ROLES


def _memcache_per_rank(c: Checker) -> int | None:
    mc = c.p.kv.memcache
    if mc is None:
        return None
    if mc.dram_size == "auto":
        return memcache_dram_need(c.p, c.f.memcache_ranks)
    try:
        return parse_size(mc.dram_size)
    except ValueError:
        return None  # reported by the memcache rule


def rule_host_memory(c: Checker) -> None:
    per_rank = _memcache_per_rank(c)
    mc_need: dict[str, tuple[int, float]] = {}  # host -> (ranks, GiB)
    shm_need: dict[str, float] = {}
    for p in c.procs:
        if p.role not in ENGINE_ROLES:
            continue
        g = c.p.engine_group(p.role)
        if "ascend_store" in g.kv_connectors and per_rank:
            ranks, gb = mc_need.get(p.host, (0, 0.0))
            n = len(p.devices) or 1
            mc_need[p.host] = (ranks + n, gb + per_rank * n / GiB)
        if "ucm" in g.kv_connectors:
            shm = ucm_shm_gb(c.p, len(p.devices), g.tp * g.pp)
            if shm:
                shm_need[p.host] = shm_need.get(p.host, 0.0) + shm
    for h, (ranks, gb) in sorted(mc_need.items()):
        mem = c.p.hosts[h].memory_gb
        if mem is not None and gb > mem:
            mc = c.p.kv.memcache
            assert mc is not None
            most = int(mem // ranks) if ranks else 0
            c.err(
                ("kv", "memcache", "dram_size"),
                f"{mc.dram_size} per rank x {ranks} LocalService ranks on '{h}' = {gb:.0f} GB, "
                f"above its memory_gb {mem:g}. Lower dram_size to {most}GB or less, or correct "
                f"hosts.{h}.memory_gb.",
            )
    for h, gb in sorted(shm_need.items()):
        mem = c.p.hosts[h].memory_gb
        if mem is not None and gb > mem:
            c.err(
                ("kv", "ucm", "cache_buffer_capacity_gb"),
                f"UCM's share buffers on '{h}' need {gb:g} GB of /dev/shm (tmpfs: host memory), "
                f"above its memory_gb {mem:g}. Lower kv.ucm.cache_buffer_capacity_gb, set "
                "kv.ucm.config.share_buffer_enable: false, or correct the host's memory_gb.",
            )
