"""The lease of a deployment, as data: one change (`up`, `down`, `restart`) at a time.

This module is pure: it parses what a lease host reports (untrusted), renders the record kvpd
writes, and decides from a record and the lease host's clock whether a controller may take the
lease. Talking to the host is kvpd.exec.lease.host.

A record names who holds the lease (user@host, the controller's PID, the operation, since when)
and its time to live. The lease expires `ttl_s` seconds after the file was last written (its
mtime): the lease host's kernel stamps that time at every renewal and the host reports its own
`date` with it, so expiry is judged by one clock, the lease host's, the same for every
controller however far their own clocks drift (a laptop an hour off would otherwise break or
never expire a live lease).

What a host reports is trusted only to refuse or to expire: a record is accepted only in its
exact shape (size, keys, types, printable text within bounds), its time to live is clamped to
the bounds kvpd allows, and a file kvpd cannot read counts as held (by an unknown holder) until
its mtime is older than the caller's time to live. Nothing in it is ever run or signalled.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Literal, get_args

from kvpd.errors import StateError

LEASE_MIN_S = 3  # runtime.lease_s bounds (kvpd/profile/schema.py)
LEASE_MAX_S = 3600
LEASE_DEFAULT_S = 60
MAX_BYTES = 4096
SCHEMA = 1
Operation = Literal["up", "down", "restart"]
OPERATIONS: tuple[Operation, ...] = get_args(Operation)
_WORD = re.compile(r"^[A-Za-z0-9._@+:-]{1,64}$")
_HEX = re.compile(r"^[0-9a-f]{32}$")
_FUTURE_SLACK_S = 5  # an mtime this far ahead of the host's own clock is not believed


@dataclass(frozen=True)
class Holder:
    """Who a controller is, as the lease names it. `machine` (boot id and PID namespace) and
    `start_ticks` let a controller on the same machine tell that a holder's process is gone."""

    user: str
    host: str
    pid: int
    start_ticks: int
    machine: str

    @property
    def who(self) -> str:
        return f"{self.user}@{self.host}"


@dataclass(frozen=True)
class LeaseRecord:
    """The content of a lease file (JSON)."""

    token: str
    holder: Holder
    operation: Operation
    since: int  # the lease host's epoch seconds when the lease was taken
    ttl_s: int
    seq: int = 0  # bumped at every renewal, so a renewal changes the content

    def render(self) -> str:
        d = {"kvpd_lease": SCHEMA, **asdict(self)}
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    def renewed(self) -> LeaseRecord:
        return replace(self, seq=self.seq + 1)


def word(text: str) -> str:
    """`text` in the characters a record allows (others become '_'), for kvpd's own names."""
    cleaned = re.sub(r"[^A-Za-z0-9._@+:-]", "_", text)[:64]
    return cleaned or "_"


def _field(d: dict[str, object], key: str, kind: type) -> object:
    v = d.get(key)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ValueError(f"{key!r} is not {'an integer' if kind is int else 'text'}")
    if isinstance(v, str) and not _WORD.match(v):
        raise ValueError(f"{key!r} is not a short printable word")
    if isinstance(v, int) and not 0 <= v < 2**63:
        raise ValueError(f"{key!r} is out of range")
    return v


def _holder(v: object) -> Holder:
    if not isinstance(v, dict) or set(v) != {"user", "host", "pid", "start_ticks", "machine"}:
        raise ValueError("'holder' is not a holder record")
    return Holder(
        user=str(_field(v, "user", str)),
        host=str(_field(v, "host", str)),
        pid=int(_field(v, "pid", int)),  # type: ignore[call-overload]
        start_ticks=int(_field(v, "start_ticks", int)),  # type: ignore[call-overload]
        machine=str(_field(v, "machine", str)),
    )


def parse(content: str) -> LeaseRecord:
    """The record in `content`; ValueError (why, in a few words) unless it is exactly one."""
    if len(content.encode()) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    if not content.isprintable():
        raise ValueError("not printable text")
    try:
        d = json.loads(content)
    except ValueError:
        raise ValueError("not JSON") from None
    keys = {"kvpd_lease", "token", "holder", "operation", "since", "ttl_s", "seq"}
    if not isinstance(d, dict) or set(d) != keys or d.get("kvpd_lease") != SCHEMA:
        raise ValueError("not a kvpd lease record")
    token, op = str(_field(d, "token", str)), str(_field(d, "operation", str))
    if not _HEX.match(token) or op not in OPERATIONS:
        raise ValueError("bad token or operation")
    ttl = int(_field(d, "ttl_s", int))  # type: ignore[call-overload]
    if not LEASE_MIN_S <= ttl <= LEASE_MAX_S:
        raise ValueError(f"time to live {ttl} s is outside {LEASE_MIN_S}..{LEASE_MAX_S}")
    return LeaseRecord(
        token=token,
        holder=_holder(d.get("holder")),
        operation=op,
        since=int(_field(d, "since", int)),  # type: ignore[call-overload]
        ttl_s=ttl,
        seq=int(_field(d, "seq", int)),  # type: ignore[call-overload]
    )


@dataclass(frozen=True)
class Seen:
    """One read of a lease host: its clock, and the lease file's mtime, version (what a
    compare-and-swap names) and content (None: no lease file)."""

    now: int
    mtime: int | None = None
    content: str | None = None
    version: str = ""

    @property
    def target(self) -> str:
        """What `--break-lease` confirmed to take over: the holder's token (stable across its
        renewals), or a digest of content kvpd cannot read."""
        if self.content is None:
            return ""
        try:
            return parse(self.content).token
        except ValueError:
            return "unreadable:" + hashlib.sha256(self.content.encode()).hexdigest()[:16]


class Verdict(Enum):
    FREE = "free"  # no lease: create it
    EXPIRED = "expired"  # not renewed within its time to live: take it over
    HOLDER_GONE = "holder-gone"  # its controller's process is gone (same machine): take it over
    BROKEN = "broken"  # live, and the caller confirmed taking over this very lease
    HELD = "held"  # live: refuse


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    record: LeaseRecord | None = None  # the holder's, when there is a readable one
    problem: str = ""  # why the content could not be read, when it could not
    remaining_s: int = 0  # until the lease expires unless renewed (HELD, BROKEN)

    @property
    def may_take(self) -> bool:
        return self.verdict is not Verdict.HELD


def decide(
    seen: Seen,
    me: Holder,
    *,
    ttl_s: int,
    take_over: str = "",
    gone: frozenset[tuple[int, int]] = frozenset(),
) -> Decision:
    """May `me` take the lease seen? `ttl_s`: the caller's time to live, used for content it
    cannot read. `take_over`: the target (Seen.target) the user confirmed breaking. `gone`:
    (pid, start_ticks) of processes known gone on `me`'s machine (a holder there whose process
    is gone has died without releasing)."""
    if seen.content is None or seen.mtime is None:
        return Decision(Verdict.FREE)
    try:
        record: LeaseRecord | None = parse(seen.content)
        problem = ""
    except ValueError as e:
        record, problem = None, str(e)
    ttl = record.ttl_s if record else max(LEASE_MIN_S, min(LEASE_MAX_S, ttl_s))
    written = min(seen.mtime, seen.now + _FUTURE_SLACK_S)
    remaining = max(0, min(ttl, written + ttl - seen.now))
    if remaining <= 0:
        return Decision(Verdict.EXPIRED, record, problem)
    h = record.holder if record else None
    if h is not None and h.host == me.host and h.machine == me.machine:
        if (h.pid, h.start_ticks) in gone:
            return Decision(Verdict.HOLDER_GONE, record, problem)
    if take_over and take_over == seen.target:
        return Decision(Verdict.BROKEN, record, problem, remaining)
    return Decision(Verdict.HELD, record, problem, remaining)


def clock(epoch: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(epoch))


class LeaseHeld(StateError):
    """Another change holds the lease. `target` is what `--break-lease` takes over."""

    def __init__(self, message: str, target: str) -> None:
        super().__init__(message)
        self.target = target


class LeaseLost(StateError):
    """The lease was taken over while this change ran (it was broken, or it expired)."""


def held_message(deployment: str, d: Decision, where: str) -> str:
    """The refusal: who changes `deployment` since when, and what the user can do."""
    tail = (
        f"lease expires in {d.remaining_s} s unless renewed; wait, or `--break-lease` to take "
        f"it over (lease: {where})"
    )
    r = d.record
    if r is None:
        return (
            f"deployment {deployment!r} has a lease kvpd cannot read ({d.problem}): another "
            f"change may be running; {tail}"
        )
    return (
        f"deployment {deployment!r} is being changed by {r.holder.who} (kvpd pid "
        f"{r.holder.pid}, {r.operation}) since {clock(r.since)}; {tail}"
    )


def holder_line(r: LeaseRecord | None) -> str:
    """`alice@laptop (kvpd pid 123, up) since 19:30:01 UTC`, or what stands for a bad record."""
    if r is None:
        return "an unreadable lease"
    return f"{r.holder.who} (kvpd pid {r.holder.pid}, {r.operation}) since {clock(r.since)}"
