"""Placement honours what the profile asks: dp_size_local, pack or spread, no idle host."""

from __future__ import annotations

from pathlib import Path

from tests.unit.newcomer import error, placed, plan


def test_pack_refuses_a_listed_host_left_idle(tmp_path: Path) -> None:
    e = error(tmp_path)
    assert "newcomer.yaml:14: mixed.hosts: mixed lists npu-b" in e
    assert "placement: spread" in e
    assert "allow_idle_hosts: true" in e


def test_idle_host_accepted_when_intended(tmp_path: Path) -> None:
    p = plan(tmp_path, "mixed.allow_idle_hosts=true")
    assert placed(p, "mixed") == [("mixed-0", "npu-a"), ("mixed-1", "npu-a")]


def test_spread_puts_each_instance_on_its_own_host(tmp_path: Path) -> None:
    p = plan(tmp_path, "mixed.placement=spread")
    assert placed(p, "mixed") == [("mixed-0", "npu-a"), ("mixed-1", "npu-b")]
    assert all(x.devices == tuple(range(8)) for x in p.processes if x.role == "mixed")


def test_dp_size_local_is_ranks_per_host(tmp_path: Path) -> None:
    p = plan(tmp_path, "mixed.instances=1", "mixed.dp=2", "mixed.dp_size_local=1")
    assert placed(p, "mixed") == [("mixed-dp0", "npu-a"), ("mixed-dp1", "npu-b")]


def test_dp_packs_by_default_and_spreads_when_asked(tmp_path: Path) -> None:
    one = ("mixed.instances=1", "mixed.dp=2")
    packed = plan(tmp_path, *one, "mixed.allow_idle_hosts=true")
    assert {h for _, h in placed(packed, "mixed")} == {"npu-a"}
    spread = plan(tmp_path, *one, "mixed.placement=spread")
    assert [h for _, h in placed(spread, "mixed")] == ["npu-a", "npu-b"]


def test_idle_devices_on_a_listed_host_warn(tmp_path: Path) -> None:
    p = plan(tmp_path, "mixed.instances=3", "mixed.placement=spread")
    w = "\n".join(p.warnings)
    assert "hosts.npu-b.devices: 8 of the 16 devices of 'npu-b' run no engine (8-15)" in w


def test_dp_packed_onto_one_host_is_refused_with_both_fixes(tmp_path: Path) -> None:
    e = error(tmp_path, "mixed.instances=1", "mixed.dp=2")
    assert "mixed.hosts: mixed lists npu-b but its 1 instance(s) of dp 2 x tp 8" in e
    assert "`placement: spread`" in e
    assert "`dp_size_local: 1`" in e
