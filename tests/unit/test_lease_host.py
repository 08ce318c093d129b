"""The lease on its host (kvpd.exec.lease.host, lease_scope): the real snippet through the local
transport (sh, flock and a real file system under a private HOME), races of real threads, and
the fake host (kvpd.testing) for a host clock moved on demand and for an unreachable host."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from kvpd.errors import StateError, TransportError
from kvpd.exec.lease import host as lease_host
from kvpd.exec.lease.host import LEASE_SH, MAX_READ, UNLEASED, HostLease, LeaseHostError
from kvpd.exec.lease.model import Holder, LeaseHeld, LeaseLost, Verdict
from kvpd.exec.local import LocalTransport
from kvpd.exec.service import Deployments
from kvpd.plan.value import HostSpec, Plan
from kvpd.testing.transport import FakeTransport

OTHER = Holder("bob", "desk", 456, 7_000, "boot-b:1")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))  # the local transport's `~`
    return tmp_path


def plan(*hosts: str, lease_s: int = 60, name: str = "demo") -> Plan:
    specs = tuple(HostSpec(name=h, address="127.0.0.1", transport="local") for h in hosts)
    return Plan(name, "digest", specs, (), (), lease_s=lease_s)


def test_the_lease_host_is_the_first_host_by_name_whatever_the_order() -> None:
    assert lease_host.lease_host(plan("p2", "d1", "proxy")) == "d1"
    assert lease_host.lease_path("demo") == "~/.kvpd/leases/demo.json"
    assert str(MAX_READ) in LEASE_SH  # the snippet reads one byte more than a record may have


def test_take_renew_release_on_a_real_host(home: Path) -> None:
    host = HostLease(LocalTransport(), "demo")
    held = lease_host.take(host, "up", ttl_s=30)
    path = home / ".kvpd" / "leases" / "demo.json"
    rec = json.loads(path.read_text())
    assert rec["operation"] == "up"
    assert rec["holder"]["pid"] == os.getpid()
    assert rec["holder"]["start_ticks"] > 0
    assert rec["ttl_s"] == 30
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert oct((path.parent / ".lock").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(LeaseHeld, match=r"being changed by .* \(kvpd pid \d+, up\) since"):
        lease_host.take(host, "down", ttl_s=30, holder=OTHER)
    renewer = lease_host.Renewer(held)
    assert renewer.renew()
    assert json.loads(path.read_text())["seq"] == 1
    assert renewer.release() == ""
    assert not path.exists()


def test_release_leaves_a_lease_that_is_no_longer_ours(home: Path) -> None:
    host = HostLease(LocalTransport(), "demo")
    renewer = lease_host.Renewer(lease_host.take(host, "up", ttl_s=30))
    seen = host.read()
    broken = lease_host.take(host, "down", ttl_s=30, holder=OTHER, take_over=seen.target)
    assert broken.decision.verdict is Verdict.BROKEN
    assert broken.replaced is not None
    assert not renewer.renew()
    why = renewer.release()
    assert "taken over; it is now held by bob@desk (kvpd pid 456, down)" in why, why
    assert json.loads(host.read().content or "{}")["holder"]["user"] == "bob"


def _race(host: HostLease, n: int, take_over: str) -> list[str]:
    barrier, won = threading.Barrier(n), []

    def one(i: int) -> None:
        who = Holder(f"u{i}", f"desk{i}", 1000 + i, 1, f"boot-{i}:1")  # four machines
        barrier.wait()
        try:
            lease_host.take(host, "up", ttl_s=30, holder=who, take_over=take_over)
            won.append(who.user)
        except LeaseHeld:
            pass

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_of_racing_creators_and_breakers_exactly_one_wins(home: Path) -> None:
    host = HostLease(LocalTransport(), "demo")
    assert len(_race(host, 4, "")) == 1  # nobody held it
    assert len(_race(host, 4, host.read().target)) == 1  # all confirmed breaking the same lease


def test_a_lease_kvpd_cannot_read_is_refused_then_expires(home: Path) -> None:
    path = home / ".kvpd" / "leases" / "demo.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00\xff" * 3000)  # binary, too large
    host = HostLease(LocalTransport(), "demo")
    with pytest.raises(LeaseHeld, match="a lease kvpd cannot read"):
        lease_host.take(host, "up", ttl_s=30)
    old = path.stat().st_mtime - 31
    os.utime(path, (old, old))
    held = lease_host.take(host, "up", ttl_s=30)
    assert held.decision.verdict is Verdict.EXPIRED
    assert held.replaced is None


def test_a_lease_of_a_process_gone_from_this_machine_is_taken_at_once(home: Path) -> None:
    host = HostLease(LocalTransport(), "demo")
    here = lease_host.me()
    dead = Holder(here.user, here.host, here.pid, here.start_ticks + 1, here.machine)
    lease_host.take(host, "up", ttl_s=600, holder=dead)  # this PID, but another start time
    held = lease_host.take(host, "down", ttl_s=60)
    assert held.decision.verdict is Verdict.HOLDER_GONE


# -- the fake host: its clock moves on demand ----------------------------------------------


def test_a_lease_not_renewed_expires_by_the_hosts_clock() -> None:
    fake, clock = FakeTransport("h1"), [1_000_000.0]
    fake.clock = lambda: clock[0]
    host = HostLease(fake, "demo")
    lease_host.take(host, "up", ttl_s=10, holder=OTHER)
    clock[0] += 9
    with pytest.raises(LeaseHeld, match="lease expires in 1 s unless renewed"):
        lease_host.take(host, "down", ttl_s=10)
    clock[0] += 1
    held = lease_host.take(host, "down", ttl_s=10)
    assert held.decision.verdict is Verdict.EXPIRED
    assert held.replaced is not None
    assert held.replaced.holder == OTHER
    assert fake.ran[0][:3] == ("sh", "-c", LEASE_SH)


def test_renewal_stamps_the_hosts_time() -> None:
    fake, clock = FakeTransport("h1"), [1_000_000.0]
    fake.clock = lambda: clock[0]
    held = lease_host.take(HostLease(fake, "demo"), "up", ttl_s=10)
    renewer = lease_host.Renewer(held)
    clock[0] += 8
    assert renewer.renew()
    clock[0] += 8  # 16 s after the take, 8 after the renewal: still held
    with pytest.raises(LeaseHeld):
        lease_host.take(HostLease(fake, "demo"), "down", ttl_s=10, holder=OTHER)


def test_an_unreachable_lease_host_refuses_the_change_unless_the_user_goes_on() -> None:
    fake = FakeTransport("h1")
    fake.unreachable = True
    with Deployments(transports={"h1": fake, "h2": FakeTransport("h2")}) as svc:
        p = plan("h2", "h1")
        with pytest.raises(LeaseHostError) as e, svc.lease(p, "up"):
            pass
        msg = str(e.value)
        assert "cannot take the lease of deployment 'demo' on its lease host h1" in msg
        assert "(the first of its hosts by name)" in msg
        assert "--break-lease" in msg
        with svc.lease(p, "up", take_over=UNLEASED) as held:
            assert held is None
        with pytest.raises(LeaseHostError):
            svc.peek_lease(p)


def test_a_folder_where_the_lease_belongs_is_an_error_not_a_lease(home: Path) -> None:
    (home / ".kvpd" / "leases" / "demo.json").mkdir(parents=True)
    with pytest.raises(LeaseHostError, match="is a directory, not a lease file"):
        lease_host.take(HostLease(LocalTransport(), "demo"), "up", ttl_s=30)


def test_a_host_without_flock_says_what_it_needs(home: Path) -> None:
    t = LocalTransport()
    host = HostLease(t, "demo")
    bad = FakeTransport("h1")
    bad.commands["sh"] = lambda f, argv: t.run(["sh", "-c", "exit 3", *argv[3:]])
    with pytest.raises(LeaseHostError, match="The host needs sh, flock and a writable home"):
        HostLease(bad, "demo").read()
    assert host.read().content is None


# -- the service: verbs hold the lease, re-entrant, lost leases are said ---------------------


def test_a_second_service_is_refused_and_the_first_holds_one_lease_through_nesting() -> None:
    fake = FakeTransport("h1")
    p = plan("h1")
    with Deployments(transports={"h1": fake}) as a, Deployments(transports={"h1": fake}) as b:
        with a.lease(p, "up") as held, a.lease(p, "restart") as again:
            assert held is not None
            assert again is held
            with pytest.raises(LeaseHeld) as e:
                b.up(p)  # the verb itself takes the lease before anything runs
            assert f"(kvpd pid {os.getpid()}, up)" in str(e.value)
            assert all(argv[2] == LEASE_SH for argv in fake.ran)
            seen, d = b.peek_lease(p)
            assert d.verdict is Verdict.HELD
            assert seen.target == held.record.token
        assert fake.files == {}  # released


def test_a_lease_taken_over_meanwhile_fails_the_change_after_it_ran() -> None:
    fake = FakeTransport("h1")
    p = plan("h1")
    with Deployments(transports={"h1": fake}) as svc:
        with pytest.raises(LeaseLost, match="changed by another controller while this change"):
            with svc.lease(p, "up"):
                host = HostLease(fake, "demo")
                lease_host.take(host, "down", ttl_s=60, holder=OTHER, take_over=host.read().target)
        assert "bob" in fake.files[fake.resolve("~/.kvpd/leases/demo.json")].decode()
        assert issubclass(LeaseLost, StateError)
        assert issubclass(LeaseHostError, TransportError)


def test_down_without_a_record_takes_no_lease(tmp_path: Path) -> None:
    from kvpd.exec.state import StateStore

    fake = FakeTransport("h1")
    with Deployments(StateStore(tmp_path), transports={"h1": fake}) as svc:
        assert svc.down("demo") is None
    assert fake.ran == []


def test_a_local_host_keeps_the_lease_in_the_users_home_whatever_the_folder(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the `local` deployment: its run dir is under the working folder, its lease is not
    p = plan("local")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        with Deployments() as svc, svc.lease(p, "up"):
            assert (home / ".kvpd" / "leases" / "demo.json").exists()
            with Deployments() as other, pytest.raises(LeaseHeld):
                other.up(p)
    assert not (home / ".kvpd" / "leases" / "demo.json").exists()


def test_a_container_hosts_lease_is_taken_on_the_host_itself(home: Path) -> None:
    """The pool's host_transport: the lease lives in the login's home, outside the container
    (which `up` starts and `down` removes). Through the container the stand-in runtime would
    have to exec into a container that does not exist."""
    from kvpd.exec.containers.transport import ContainerTransport
    from kvpd.exec.state import StateStore
    from tests.unit.standin import spec

    local = LocalTransport()
    inside = ContainerTransport(local, spec("kvpd-t-no-such-container"))
    svc = Deployments(StateStore(home / "state"), transports={"d1": inside})
    assert svc.transports(plan("d1")).host_transport("d1") is local
    with svc.lease(plan("d1"), "up"):
        assert "up" in (home / ".kvpd" / "leases" / "demo.json").read_text()
