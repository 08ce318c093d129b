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


class Fanout:
    """One bounded pool of worker threads for operations on many hosts or processes: the
    executor, the stopper and preflight all fan out through it. A context manager."""

    def __init__(self, max_workers: int = 16) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_workers),
                                        thread_name_prefix="kvpd-fanout")  # fmt: skip

    def __enter__(self) -> Fanout:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)

    def each(
        self, fn: Callable[[H], T], items: Iterable[H], *, key: Callable[[H], str] = host_key
    ) -> dict[str, HostOutcome[T]]:
        """Call `fn(item)` for every item. Returns outcomes keyed by name in the order given.
        An exception from `fn` is recorded for its item and never stops the others;
        KeyboardInterrupt and SystemExit propagate."""
        items = list(items)
        names = [key(h) for h in items]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate host names: {names}")

        def one(item: H) -> HostOutcome[T]:
            t0 = time.monotonic()
            try:
                value = fn(item)
            except Exception as e:  # noqa: BLE001 - recorded per host; the caller decides what a failure means
                return HostOutcome(key(item), error=e, elapsed_s=time.monotonic() - t0)
            return HostOutcome(key(item), value=value, elapsed_s=time.monotonic() - t0)

        if len(items) <= 1:  # no thread hop for a single host
            return {n: one(h) for n, h in zip(names, items, strict=True)}
        futures = [self._pool.submit(one, h) for h in items]
        return {n: f.result() for n, f in zip(names, futures, strict=True)}

    def map(self, fn: Callable[[H], T], items: Iterable[H]) -> list[T]:
        """`fn(item)` for every item, in order. Every call finishes before the first
        exception (in item order) is raised as it was, so nothing is left running behind it."""
        items = list(items)
        futures = [self._pool.submit(fn, h) for h in items]
        results: list[T] = []
        first: BaseException | None = None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as e:  # noqa: BLE001 - re-raised below, after the others
                first = first or e
        if first is not None:
            raise first
        return results


def run_on_hosts(
    fn: Callable[[H], T],
    hosts: Iterable[H],
    *,
    max_workers: int = 16,
    key: Callable[[H], str] = host_key,
) -> dict[str, HostOutcome[T]]:
    """`Fanout.each` on a pool of its own (at most `max_workers` at a time)."""
    items = list(hosts)
    with Fanout(min(max_workers, max(1, len(items)))) as fan:
        return fan.each(fn, items, key=key)


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
