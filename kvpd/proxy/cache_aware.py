"""Cache-aware choice of a backend: the one already holding the longest prefix of the prompt,
unless that would overload it.

Each backend of a pool gets a PrefixIndex of the prompts it was sent (kvpd/proxy/prefix_index).
A request goes to the usable backend with the longest match (equal matches: the less loaded);
its keys then join that backend's index. The balance guard, with an absolute and a relative
bound as SGLang's cache-aware router has: when the best match's outstanding tokens exceed the
least loaded backend's by more than `balance_abs / uses` tokens *and* by more than the factor
`balance_rel`, the request goes by load instead. `uses` is how many requests with the matched
prefix that backend was sent: a prefix one earlier request had (a conversation's last turn, the
guide's seeded 80%) is followed up to the full bound, since moving it costs a whole recompute
for nothing; a prefix many requests share (a system prompt) may unbalance the pool ever less,
so it does not pin its traffic to one backend. The overflow backend then holds that prefix too,
and later requests tie between the two and split by load.

Only usable backends are considered (healthy, circuit not open, not draining), so a drained or
open backend's index is not used; an index is emptied when its backend is found down (a
restarted engine starts with an empty cache) and on /reset_prefix_cache."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, get_args

from kvpd.proxy.capacity import CapacityLearner, CapacitySource
from kvpd.proxy.prefix_index import PrefixIndex, prefix_keys

if TYPE_CHECKING:
    from kvpd.proxy.backends import Backend, BackendPool
    from kvpd.proxy.config import ProxyConfig
    from kvpd.proxy.steps import Steps

RoutingPolicy = Literal["cache-aware", "least-loaded"]
ROUTING_POLICIES: tuple[str, ...] = get_args(RoutingPolicy)
Reason = Literal["prefix_match", "balance_override", "no_match"]
REASONS: tuple[Reason, ...] = get_args(Reason)


class CacheAware:
    """The policy of one pool: an index per backend and the decisions it made, by reason."""

    def __init__(
        self,
        backends: list[Backend],
        capacity: int,
        block: int,
        balance_abs: int,
        balance_rel: float,
    ) -> None:
        self.indexes = {b.name: PrefixIndex(capacity, block) for b in backends}
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.decisions: Counter[Reason] = Counter({r: 0 for r in REASONS})
        # where each backend's capacity comes from: the configured figure until its engine
        # tells its real one (kvpd/proxy/capacity.py)
        self.sources: dict[str, CapacitySource] = {b.name: "configured" for b in backends}

    def choose(
        self, pool: BackendPool, exclude: tuple[Backend, ...], keys: Sequence[int]
    ) -> Backend | None:
        least = pool.least_loaded(exclude)
        if least is None:
            return None
        indexes = self.indexes
        best, best_len = least, self._current(least).match(keys)
        for b in pool.backends:
            if b is least or not b.usable or b in exclude:
                continue
            n = self._current(b).match(keys)
            if n > best_len or (n == best_len and b.outstanding < best.outstanding):
                best, best_len = b, n
        reason: Reason
        if best_len == 0:
            reason, chosen = "no_match", least
        elif best is not least and self.overloaded(
            best.outstanding, least.outstanding, indexes[best.name].uses(keys[best_len - 1])
        ):
            reason, chosen = "balance_override", least
        else:
            reason, chosen = "prefix_match", best
        self.decisions[reason] += 1
        indexes[chosen.name].insert(keys, best_len if chosen is best else None)
        return chosen

    def set_capacity(self, backend: Backend, tokens: int, source: CapacitySource) -> bool:
        """Size the backend's index to `tokens`; whether that changed anything."""
        index = self.indexes[backend.name]
        if index.capacity == tokens and self.sources[backend.name] == source:
            return False
        index.resize(tokens)
        self.sources[backend.name] = source
        return True

    def overloaded(self, best: int, least: int, uses: int) -> bool:
        """Whether the best match is too loaded, for a prefix it was sent `uses` times."""
        return best - least > self.balance_abs / max(1, uses) and best > least * self.balance_rel

    def _current(self, backend: Backend) -> PrefixIndex:
        """The backend's index, emptied first when the backend was found unhealthy since the
        index last saw it: whatever comes back is likely a restarted engine with an empty
        cache. (Only usable backends are looked at, so one that is down now keeps its index
        until it serves again.)"""
        index = self.indexes[backend.name]
        downs = backend.transitions["unhealthy"]
        if downs != index.downs:
            index.downs = downs
            index.clear()
        return index

    def clear(self) -> None:
        for index in self.indexes.values():
            index.clear()


def install_routing(
    cfg: ProxyConfig,
    prefillers: BackendPool,
    decoders: BackendPool,
    steps: Steps,
    auth_header: bytes = b"",
) -> CapacityLearner | None:
    """With --routing cache-aware: a policy for the prefillers, for the decoders when they are
    the mixed engines (or with --decode-affinity), and the prompts' keys for the steps; only
    for pools of two or more backends (with one there is nothing to choose, and no CPU is
    spent on keys). The learner (to run as a task) sizes each index from its engine.
    Otherwise nothing: every choice stays by load, as the pools make it."""
    if cfg.routing != "cache-aware":
        return None
    pools = [prefillers] + ([decoders] if cfg.flow == "mixed" or cfg.decode_affinity else [])
    for pool in pools:
        if len(pool.backends) > 1:
            pool.policy = CacheAware(
                pool.backends,
                cfg.prefix_capacity_tokens,
                cfg.prefix_block,
                cfg.balance_abs_tokens,
                cfg.balance_rel,
            )
    if prefillers.policy is None and decoders.policy is None:
        return None
    block = cfg.prefix_block
    steps.keys = lambda body: prefix_keys(body, block)
    return CapacityLearner([prefillers, decoders], auth_header)


def clear_indexes(*pools: BackendPool) -> None:
    for pool in pools:
        if pool.policy is not None:
            pool.policy.clear()


def render(
    pools: tuple[BackendPool, ...], family: Callable[[str, str, str], None], out: list[str]
) -> None:
    """The routing metrics of the pools that route by cache."""
    routed = [(p, p.policy) for p in pools if p.policy is not None]
    if not routed:
        return
    family(
        "kvpd_proxy_routing_decisions_total",
        "counter",
        "Cache-aware backend choices, by reason: prefix_match (the longest cached prefix), "
        "balance_override (the best match was too loaded), no_match (least loaded).",
    )
    for pool, cache in routed:
        for reason in REASONS:
            out.append(f'kvpd_proxy_routing_decisions_total{{role="{pool.role}",'
                       f'reason="{reason}"}} {cache.decisions[reason]}')  # fmt: skip
    gauges = (
        ("chunks", "Prompt chunks in each backend's prefix index.",
         lambda c, b: len(c._current(b))),
        ("tokens", "Tokens of the prompt chunks in each backend's prefix index.",
         lambda c, b: c.indexes[b.name].tokens),
        ("capacity_tokens", "Tokens each backend's prefix index may hold: its engine's "
         "num_gpu_blocks x block_size (source=engine) once the engine reported them, else "
         "--prefix-capacity-tokens (source=configured).",
         lambda c, b: c.indexes[b.name].capacity),
    )  # fmt: skip
    for name, doc, value in gauges:
        family(f"kvpd_proxy_prefix_index_{name}", "gauge", doc)
        for pool, cache in routed:
            for b in pool.backends:
                source = f',source="{cache.sources[b.name]}"' if name == "capacity_tokens" else ""
                out.append(f'kvpd_proxy_prefix_index_{name}{{role="{pool.role}",'
                           f'backend="{b.name}"{source}}} {value(cache, b)}')  # fmt: skip
