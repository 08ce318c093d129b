"""The lease as data (kvpd.exec.lease.model): what a lease host reports is parsed strictly, and the
decision to take, take over or refuse a lease is made from the record and the lease host's
clock alone."""

from __future__ import annotations

import json

import pytest

from kvpd.exec.lease import model as lease
from kvpd.exec.lease.model import Decision, Holder, LeaseRecord, Seen, Verdict, decide

ALICE = Holder("alice", "laptop", 123, 9_000, "boot-a:4026531836")
BOB = Holder("bob", "desk", 456, 7_000, "boot-b:4026531836")
T0 = 1_796_153_401  # 19:30:01 UTC


def record(holder: Holder = ALICE, *, since: int = T0, ttl_s: int = 60, seq: int = 0) -> str:
    return LeaseRecord("ab" * 16, holder, "up", since, ttl_s, seq).render()


def seen(content: str | None, *, now: int, mtime: int = T0) -> Seen:
    return Seen(now, mtime if content is not None else None, content, "v" if content else "")


def test_a_record_round_trips_and_every_renewal_changes_its_content() -> None:
    r = LeaseRecord("ab" * 16, ALICE, "up", T0, 60)
    assert lease.parse(r.render()) == r
    assert r.renewed().render() != r.render()
    assert lease.parse(r.renewed().render()).seq == 1


def _mutated(**change: object) -> str:
    d = json.loads(record())
    d.update(change)
    return json.dumps(d)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("x" * 5000, "larger than 4096 bytes"),
        (record() + "\n", "not printable text"),
        (record().replace("alice", "al\x1bice"), "not printable text"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a kvpd lease record"),
        (_mutated(extra=1), "not a kvpd lease record"),
        (_mutated(kvpd_lease=2), "not a kvpd lease record"),
        (_mutated(token="../../etc"), "'token' is not a short printable word"),
        (_mutated(token="AB" * 16), "bad token or operation"),
        (_mutated(operation="rm"), "bad token or operation"),
        (_mutated(ttl_s=10**9), "outside 3..3600"),
        (_mutated(ttl_s=True), "'ttl_s' is not an integer"),
        (_mutated(since=-1), "'since' is out of range"),
        (_mutated(holder={"user": "x"}), "'holder' is not a holder record"),
        (_mutated(holder={**ALICE.__dict__, "user": "a b"}), "'user' is not a short printable"),
        (_mutated(holder={**ALICE.__dict__, "pid": "123"}), "'pid' is not an integer"),
    ],
)
def test_anything_but_an_exact_record_is_refused(content: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(".", r"\.")):
        lease.parse(content)


def test_no_lease_file_is_free() -> None:
    assert decide(Seen(T0), BOB, ttl_s=60).verdict is Verdict.FREE


def test_a_live_lease_is_refused_naming_its_holder_and_since_when() -> None:
    d = decide(seen(record(), now=T0 + 18), BOB, ttl_s=60)
    assert d.verdict is Verdict.HELD
    assert not d.may_take
    assert d.remaining_s == 42
    msg = lease.held_message("demo", d, "h1:~/.kvpd/leases/demo.json")
    assert msg == (
        "deployment 'demo' is being changed by alice@laptop (kvpd pid 123, up) since 19:30:01 "
        "UTC; lease expires in 42 s unless renewed; wait, or `--break-lease` to take it over "
        "(lease: h1:~/.kvpd/leases/demo.json)"
    )


def test_expiry_is_judged_by_the_hosts_clock_from_the_last_write() -> None:
    # Renewed at T0 + 50 (mtime): still live at T0 + 100 though `since` is older than the TTL.
    assert decide(seen(record(), now=T0 + 100, mtime=T0 + 50), BOB, ttl_s=60).remaining_s == 10
    d = decide(seen(record(), now=T0 + 110, mtime=T0 + 50), BOB, ttl_s=60)
    assert d.verdict is Verdict.EXPIRED
    assert d.may_take
    assert d.record is not None


def test_the_records_own_time_to_live_counts_not_the_callers() -> None:
    live = seen(record(ttl_s=600), now=T0 + 100)
    assert decide(live, BOB, ttl_s=3).verdict is Verdict.HELD


def test_an_mtime_in_the_future_buys_no_more_than_the_time_to_live() -> None:
    d = decide(seen(record(ttl_s=60), now=T0, mtime=T0 + 10**6), BOB, ttl_s=60)
    assert d.verdict is Verdict.HELD
    assert d.remaining_s == 60


def test_an_unreadable_lease_is_held_until_the_callers_time_to_live_passes() -> None:
    d = decide(seen("garbage", now=T0 + 5), BOB, ttl_s=30)
    assert d.verdict is Verdict.HELD
    assert d.record is None
    assert d.remaining_s == 25
    assert "a lease kvpd cannot read (not JSON)" in lease.held_message("demo", d, "h1:x")
    assert decide(seen("garbage", now=T0 + 30), BOB, ttl_s=30).verdict is Verdict.EXPIRED
    # the caller's TTL is clamped to kvpd's bounds
    assert decide(seen("garbage", now=T0 + 3601), BOB, ttl_s=10**9).verdict is Verdict.EXPIRED


def test_breaking_takes_only_the_lease_the_user_confirmed() -> None:
    s = seen(record(), now=T0 + 1)
    assert decide(s, BOB, ttl_s=60, take_over=s.target).verdict is Verdict.BROKEN
    other = seen(record(BOB), now=T0 + 1)
    other_token = LeaseRecord("cd" * 16, BOB, "down", T0, 60).render()
    assert decide(seen(other_token, now=T0 + 1), ALICE, ttl_s=60, take_over=s.target).verdict is (
        Verdict.HELD
    )
    assert s.target == other.target  # same token: a renewal keeps what was confirmed
    garbage = seen("garbage", now=T0 + 1)
    assert garbage.target.startswith("unreadable:")
    assert decide(garbage, BOB, ttl_s=60, take_over=garbage.target).verdict is Verdict.BROKEN


def test_a_holder_gone_from_this_machine_is_taken_over_at_once() -> None:
    me = Holder("alice", "laptop", 999, 1, ALICE.machine)
    s = seen(record(), now=T0 + 1)
    gone = frozenset({(ALICE.pid, ALICE.start_ticks)})
    assert decide(s, me, ttl_s=60, gone=gone).verdict is Verdict.HOLDER_GONE
    assert decide(s, me, ttl_s=60).verdict is Verdict.HELD  # alive: refused
    # Another machine with the same host name: its PIDs are not this machine's to judge.
    elsewhere = Holder("alice", "laptop", 999, 1, "boot-z:1")
    assert decide(s, elsewhere, ttl_s=60, gone=gone).verdict is Verdict.HELD


def test_the_holder_line_names_user_host_pid_operation_and_time() -> None:
    assert lease.holder_line(lease.parse(record())) == (
        "alice@laptop (kvpd pid 123, up) since 19:30:01 UTC"
    )
    assert lease.holder_line(None) == "an unreadable lease"
    assert Decision(Verdict.FREE).may_take


def test_own_names_are_cut_to_what_a_record_allows() -> None:
    assert lease.word("Alice Smith's laptop") == "Alice_Smith_s_laptop"
    assert lease.word("") == "_"
    assert len(lease.word("x" * 100)) == 64
