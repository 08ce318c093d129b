"""Preflight checks the releases the layerwise guide pins: MemFabric as its lib path names it,
memcache built for that MemFabric, and the NPU driver MemFabric 1.2 needs (scripted hosts)."""

from __future__ import annotations

from kvpd.exec.preflight.checks import Check
from kvpd.exec.preflight.pinned_versions import pinned_checks
from kvpd.exec.transport import CommandResult
from kvpd.plan.build import load_plan
from kvpd.testing.transport import FakeTransport

PLAN = load_plan("layerwise-sparse-1p1d")  # MemFabric 1.2.0 lib path on p1 and d1


def _checks(versions: dict[str, dict[str, str | None]], driver: str | None) -> dict[str, Check]:
    hosts = {h: FakeTransport(h) for h in ("p1", "d1")}
    info = f"Version={driver}\nascendhal_version=7.35.23\n" if driver else ""
    for t in hosts.values():
        t.commands["cat"] = lambda self, argv: CommandResult(
            tuple(argv), 0 if info else 1, info, ""
        )
    got = pinned_checks(PLAN, versions, lambda h: hosts[h], {"p1", "d1"})
    return {f"{c.host} {c.name}": c for c in got}


def test_the_guides_releases_pass() -> None:
    got = _checks({"memfabric-hybrid": {"p1": "1.2.0", "d1": "1.2.0"},
                   "memcache-hybrid": {"p1": "1.2.1"}}, "25.5.1")  # fmt: skip
    assert all(c.ok for c in got.values()), got
    assert {"p1 memfabric release", "d1 memfabric release", "p1 memcache/memfabric pair",
            "p1 NPU driver", "d1 NPU driver"} <= set(got)  # fmt: skip


def test_another_memfabric_than_the_lib_path_names_fails() -> None:
    got = _checks({"memfabric-hybrid": {"p1": "1.3.0", "d1": "1.2.0"},
                   "memcache-hybrid": {"p1": "1.2.1"}}, "25.5.1")  # fmt: skip
    c = got["p1 memfabric release"]
    assert not c.ok
    assert "memfabric-hybrid 1.3.0 is installed but" in c.detail
    assert "kv.memfabric.extend_lib_path" in c.fix
    assert not got["p1 memcache/memfabric pair"].ok
    assert got["d1 memfabric release"].ok


def test_an_old_or_missing_npu_driver_fails() -> None:
    v: dict[str, dict[str, str | None]] = {"memfabric-hybrid": {"p1": "1.2.0", "d1": "1.2.0"}}
    c = _checks(v, "24.1.rc3")["d1 NPU driver"]
    assert not c.ok
    assert "older than 25.5.1" in c.detail
    assert "upgrade" in c.fix
    c = _checks(v, None)["p1 NPU driver"]
    assert not c.ok
    assert "/usr/local/Ascend/driver/version.info" in c.detail
