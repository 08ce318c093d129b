"""A newcomer's own A3 cluster, written from the README: the profile the placement, capacity
and settings tests vary (two 16-die hosts, a GQA model, one mixed group)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan
from kvpd.plan.value import Plan

CLUSTER = """\
name: newcomer
hardware: a3
hosts:
  npu-a: {address: 10.0.0.1, nic: eth0}
  npu-b: {address: 10.0.0.2, nic: eth0}
model:
  path: /data/models/QwQ-32B
  attention: gqa
  layers: 64
  kv_heads: 8
  head_dim: 128
  max_model_len: 8192
mixed:
  hosts: [npu-a, npu-b]
  instances: 2
  tp: 8
  port: 8000
"""


def write(tmp_path: Path, text: str = CLUSTER) -> str:
    path = tmp_path / "newcomer.yaml"
    path.write_text(text)
    return str(path)


def plan(tmp_path: Path, *sets: str, text: str = CLUSTER) -> Plan:
    return load_plan(write(tmp_path, text), sets=list(sets), base_dir="/srv/kvpd")


def error(tmp_path: Path, *sets: str, text: str = CLUSTER) -> str:
    with pytest.raises(ProfileError) as e:
        plan(tmp_path, *sets, text=text)
    return str(e.value)


def placed(p: Plan, role: str) -> list[tuple[str, str]]:
    """(process, host) of the role's engines, in plan order."""
    return [(x.name, x.host) for x in p.processes if x.role == role]
