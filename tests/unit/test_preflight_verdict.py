"""Preflight's verdict from recorded probe output: no host is asked, each check is what the
probe's JSON and the plan's requirements say (the output below was recorded from `PROBE`)."""

from __future__ import annotations

import json
from typing import Any

from kvpd.exec.preflight.checks import Check
from kvpd.exec.preflight.verdict import judge_hosts, version_mismatches
from kvpd.plan.value import HostRequirements, Interpreter, PackageNeed

# `python3 -c PROBE` on two hosts sharing /shared; host b also holds port 8100.
RECORDED = {
    "a": """{"arch": "x86_64", "python3": "3.11.7", "packages": [{"site": "/venv/lib/site",
      "python": "3.11.7", "v": {"vllm": "0.9.1", "kvpd-no-such": null}}],
      "commands": {"sh": true, "nope": false}, "paths": {"/models/m": true},
      "mem_available": 21969371136, "shm_free": 1073741824, "busy_ports": [],
      "shared": {"/shared": {"exists": true, "writable": true, "dev": 65024, "wrote": true,
      "sees": ["b"]}}}""",
    "b": """{"arch": "aarch64", "python3": "3.10.12", "packages": [{"site": "/venv/lib/site",
      "python": "3.10.12", "v": {"vllm": "0.9.2", "kvpd-no-such": null}}],
      "commands": {"sh": true, "nope": false}, "paths": {"/models/m": false},
      "mem_available": 1073741824, "shm_free": 1073741824, "busy_ports": [8100],
      "shared": {"/shared": {"exists": true, "writable": true, "dev": 12, "wrote": true,
      "sees": []}}}""",
}


def need() -> HostRequirements:
    return HostRequirements(
        packages=(PackageNeed(Interpreter(path="/venv/bin/python"), ("vllm", "kvpd-no-such")),),
        commands=("sh", "nope"),
        paths=("/models/m",),
        shared_dirs=("/shared",),
        memory_gb=4,
    )


def verdict(results: dict[str, dict[str, Any]]) -> dict[tuple[str, str], Check]:
    v = judge_hosts(
        {h: need() for h in results},
        results,
        {h: [8100, 8200] for h in results},
        {"/shared": sorted(results)},
        lambda h, busy: f"in use: {busy} on {h}",
    )
    checks = v.checks + version_mismatches(v.versions)
    return {(c.host, c.name): c for c in checks}


def test_verdict_from_recorded_probe_output() -> None:
    got = verdict({h: json.loads(out) for h, out in RECORDED.items()})
    assert got["a", "reachable"].detail == "x86_64, python 3.11.7"
    assert got["a", "package vllm"].ok
    missing = got["a", "package kvpd-no-such"]
    assert not missing.ok
    assert missing.fix == "pip install kvpd-no-such into the environment of python /venv/bin/python"
    assert not got["a", "command nope"].ok
    assert got["a", "path /models/m"].ok
    assert not got["b", "path /models/m"].ok
    assert got["a", "ports free"].detail == "2 ports free"
    assert got["b", "ports free"].detail == "in use: [8100] on b"
    assert got["a", "memory"].ok
    assert got["b", "memory"].detail == "1 GiB available, pools need 4 GiB"
    assert not got["b", "memory"].ok
    assert ("a", "/dev/shm") not in got  # not required
    assert got["a", "storage /shared"].detail == "shared with b"
    assert got["b", "storage /shared"].detail == "does not see files written by ['a']"
    mismatch = got["*", "same vllm everywhere"]
    assert mismatch.detail == "a=0.9.1, b=0.9.2"
    assert mismatch.fix == "install one vllm version on every host"
    assert ("*", "same kvpd-no-such everywhere") not in got  # absent everywhere: one value


def test_unreachable_host_is_one_check_with_a_fix() -> None:
    got = verdict({"a": {"error": "ssh: connect to host a port 22: Connection refused"}})
    assert list(got) == [("a", "reachable")]
    assert not got["a", "reachable"].ok
    assert (
        got["a", "reachable"].fix
        == "check the address, SSH user/key and known_hosts in the profile"
    )
