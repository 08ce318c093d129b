"""Preflight compares the uids of the hosts sharing a KV folder (what a plan cannot see)."""

from __future__ import annotations

from kvpd.exec.fanout import Fanout
from kvpd.exec.preflight.owners import owner_checks
from kvpd.exec.transport import CommandResult
from kvpd.plan.value import HostRequirements, HostSpec, Plan


class _Uid:
    """A host that answers `id -u` (the only command this check runs)."""

    def __init__(self, uid: str) -> None:
        self.uid = uid

    def run(self, argv: list[str], **_: object) -> CommandResult:
        assert argv == ["id", "-u"]
        return CommandResult(tuple(argv), 0, self.uid + "\n", "")


def _plan(shared: dict[str, tuple[str, ...]]) -> Plan:
    hosts = tuple(HostSpec(h, f"10.0.0.{i}") for i, h in enumerate(shared, 1))
    req = {h: HostRequirements(shared_dirs=d) for h, d in shared.items()}
    return Plan("dep", "d", hosts, (), (), requirements=req)


def test_one_uid_passes_two_uids_fail_with_who_and_the_fix() -> None:
    plan = _plan({"p1": ("/kv",), "d1": ("/kv",), "d2": ("/kv",), "x": ("/other",)})
    uids = {"p1": "0", "d1": "1500", "d2": "0", "x": "7"}
    with Fanout(4) as fan:
        (check,) = owner_checks(plan, lambda h: _Uid(uids[h]), sorted(uids), fan)  # type: ignore[arg-type,return-value]
        assert not check.ok, check
        assert check.name == "one user for /kv", check
        assert "d2, p1 as uid 0; d1 as uid 1500" in check.detail, check.detail
        assert "same uid" in check.fix, check.fix
        uids["d1"] = "0"
        (check,) = owner_checks(plan, lambda h: _Uid(uids[h]), sorted(uids), fan)  # type: ignore[arg-type,return-value]
        assert check.ok, check
        assert "uid 0" in check.detail, check
        assert not check.fix, check
