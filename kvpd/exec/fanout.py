"""Run one operation on many hosts at once, bounded, collecting a result or an error per host."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from kvpd.errors import KvpdError, TransportError

H = TypeVar("H")
T = TypeVar("T")


@dataclass(frozen=True)
class HostOutcome(Generic[T]):
    """What `fn` gave for one host: its value, or the exception it raised."""

    host: str
    value: T | None = None
    error: Exception | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def host_key(item: object) -> str:
    """The host name of a HostSpec (`name`), a transport (`host`) or a plain string."""
    for attr in ("name", "host"):
        v = getattr(item, attr, None)
        if isinstance(v, str):
            return v
    return str(item)


def run_on_hosts(
    fn: Callable[[H], T],
    hosts: Iterable[H],
    *,
    max_workers: int = 16,
    key: Callable[[H], str] = host_key,
) -> dict[str, HostOutcome[T]]:
    """Call `fn(host)` for every host, at most `max_workers` at a time.

    Returns outcomes keyed by host name in the order given. An exception from `fn` is recorded
    for its host and never stops the others; KeyboardInterrupt and SystemExit propagate.
    """
    items = list(hosts)
    names = [key(h) for h in items]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate host names: {names}")

    def one(item: H) -> HostOutcome[T]:
        t0 = time.monotonic()
        try:
            value = fn(item)
        except Exception as e:  # recorded per host; the caller decides what a failure means
            return HostOutcome(key(item), error=e, elapsed_s=time.monotonic() - t0)
        return HostOutcome(key(item), value=value, elapsed_s=time.monotonic() - t0)

    if not items:
        return {}
    if len(items) == 1 or max_workers <= 1:
        return {n: one(h) for n, h in zip(names, items, strict=True)}
    with ThreadPoolExecutor(
        max_workers=min(max_workers, len(items)), thread_name_prefix="kvpd-fanout"
    ) as pool:
        futures = [pool.submit(one, h) for h in items]
        return {n: f.result() for n, f in zip(names, futures, strict=True)}


def raise_for_failures(outcomes: dict[str, HostOutcome[T]], what: str) -> dict[str, T]:
    """The values, or one error naming every failed host. A single KvpdError is re-raised as
    is (its message already says what to do)."""
    failed = [o for o in outcomes.values() if not o.ok]
    if not failed:
        return {h: o.value for h, o in outcomes.items()}  # type: ignore[misc]
    if len(failed) == 1 and isinstance(failed[0].error, KvpdError):
        raise failed[0].error
    lines = "\n".join(f"  - {o.host}: {o.error}" for o in failed)
    raise TransportError(f"{what} failed on {len(failed)} of {len(outcomes)} hosts:\n{lines}")
