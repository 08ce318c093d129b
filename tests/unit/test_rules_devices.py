"""What a device is on each hardware: counts the servers come in, chips and dies, HBM."""

from __future__ import annotations

from pathlib import Path

from kvpd.plan.hardware import KINDS
from tests.unit.newcomer import plan
from tests.unit.test_rules import plan as bundled_plan
from tests.unit.test_rules import warnings as bundled_warnings

SPREAD = "mixed.placement=spread"


def test_each_hardware_says_what_devices_counts() -> None:
    assert (KINDS["a3"].unit, KINDS["a3"].dies_per_chip, KINDS["a3"].per_server) == (
        "die", 2, (16,)
    )  # fmt: skip
    assert (KINDS["a2"].unit, KINDS["a2"].per_server) == ("chip", (8,))
    assert KINDS["950"].unit == "chip"
    assert KINDS["cpu"].unit == "core"


def test_a3_host_declared_with_eight_devices_warns(tmp_path: Path) -> None:
    p = plan(tmp_path, SPREAD, "hosts.npu-a.devices=8", "hosts.npu-b.devices=8")
    w = "\n".join(p.warnings)
    assert "hosts.npu-a.devices: a3 counts dies" in w
    assert "a server has 16, not 8. devices: 8 is 4 chips; if you counted chips, write " in w
    assert "devices: 16" in w


def test_plan_shows_each_instances_chips_dies_and_memory(tmp_path: Path) -> None:
    p = plan(tmp_path, SPREAD)
    assert "mixed-0 on npu-a: 8 dies 0-7 = 4 chips 0-3, 8 x 64 GB = 512 GB HBM" in p.derived
    a2 = bundled_plan("ucm-centralized-2p2d")
    assert "prefill-1 on p1: 4 chips 4-7, 4 x 64 GB = 256 GB HBM" in a2.derived


def test_device_memory_is_a_host_fact(tmp_path: Path) -> None:
    p = plan(tmp_path, SPREAD, "hosts.npu-b.device_memory_gb=32")
    assert "mixed-1 on npu-b: 8 dies 0-7 = 4 chips 0-3, 8 x 32 GB = 256 GB HBM" in p.derived


def test_bundled_device_counts_are_the_servers() -> None:
    for name in ("large-ep", "layerwise-sparse-1p1d", "ucm-centralized-2p2d"):
        assert ".devices:" not in bundled_warnings(name)
