"""`--break-lease` (kvpd.cli.lease_opts): what the user is asked, and what is taken over."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from kvpd.cli import lease_opts
from kvpd.errors import TransportError
from kvpd.exec.lease.host import UNLEASED, LeaseHostError
from kvpd.exec.lease.model import Holder, LeaseRecord, Seen, decide
from kvpd.plan.value import HostSpec, Plan

ALICE = Holder("alice", "laptop", 123, 9_000, "boot-a:1")
ME = Holder("bob", "desk", 456, 7_000, "boot-b:1")
T0 = 1_796_153_401  # 19:30:01 UTC
PLAN = Plan("demo", "d", (HostSpec("h1", "10.0.0.1"),), (), ())


class Peek:
    """The service's `peek_lease`, answering what a lease host would."""

    def __init__(self, seen: Seen | None) -> None:
        self.seen = seen

    def peek_lease(self, plan: Plan) -> tuple[Seen, Any]:
        if self.seen is None:
            raise LeaseHostError("cannot take the lease of deployment 'demo' on its lease host h1")
        return self.seen, decide(self.seen, ME, ttl_s=60)


def held() -> Seen:
    content = LeaseRecord("ab" * 16, ALICE, "up", T0, 60).render()
    return Seen(T0 + 18, T0, content, "1 2")


def target(svc: Peek, *, yes: bool, monkeypatch: pytest.MonkeyPatch, tty: bool = True) -> str:
    monkeypatch.setattr("sys.stdin.isatty", lambda: tty)
    return lease_opts.break_target(svc, PLAN, break_lease=True, yes=yes)  # type: ignore[arg-type]


def test_without_the_flag_nothing_is_asked_or_taken_over() -> None:
    assert lease_opts.break_target(Peek(None), PLAN, break_lease=False, yes=False) == ""  # type: ignore[arg-type]


def test_a_free_or_expired_lease_needs_no_confirmation(monkeypatch: pytest.MonkeyPatch) -> None:
    assert target(Peek(Seen(T0)), yes=False, monkeypatch=monkeypatch, tty=False) == ""
    old = held()
    expired = Seen(T0 + 61, old.mtime, old.content, old.version)
    assert target(Peek(expired), yes=False, monkeypatch=monkeypatch, tty=False) == ""


def test_the_user_is_asked_naming_the_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(typer, "confirm", lambda q, abort: asked.append(q))
    assert target(Peek(held()), yes=False, monkeypatch=monkeypatch) == "ab" * 16
    assert asked == [
        "Deployment 'demo' is being changed by alice@laptop (kvpd pid 123, up) since 19:30:01 "
        "UTC (its lease expires in 42 s unless renewed). Take the lease over? That change may "
        "still be running."
    ]
    assert target(Peek(held()), yes=True, monkeypatch=monkeypatch, tty=False) == "ab" * 16
    assert len(asked) == 1  # --yes: not asked


def test_without_a_terminal_it_needs_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(typer.Exit) as e:
        target(Peek(held()), yes=False, monkeypatch=monkeypatch, tty=False)
    assert e.value.exit_code == 2


def test_an_unreachable_lease_host_asks_to_go_on_without_a_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(typer, "confirm", lambda q, abort: asked.append(q))
    assert target(Peek(None), yes=False, monkeypatch=monkeypatch) == UNLEASED
    assert asked[0].endswith("lease host h1.\nGo on without a lease?")
    assert issubclass(LeaseHostError, TransportError)
