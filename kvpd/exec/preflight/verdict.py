"""Preflight's verdict: the probe's recorded output per host in, checks out.

Pure: no host is touched here (the one courtesy that asks a host, naming who holds a busy port,
comes in as `describe_busy`), so the verdict is testable from recorded probe output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpd.exec.preflight.checks import Check
from kvpd.plan.value import HostRequirements

GiB = 1 << 30

# Per package name, the version each host reported (None: not importable there).
Versions = dict[str, dict[str, str | None]]


@dataclass
class Verdict:
    """The per-host checks, in the order a reader scans them, and the versions seen."""

    checks: list[Check] = field(default_factory=list)
    versions: Versions = field(default_factory=dict)


def judge_hosts(
    requirements: dict[str, HostRequirements],
    results: dict[str, dict[str, Any]],
    ports: dict[str, list[int]],
    sharing: dict[str, list[str]],
    describe_busy: Callable[[str, list[int]], str],
) -> Verdict:
    """Each host's probe output (`{"error": ...}` when it could not be probed) against what the
    plan requires of it, host by host in the order of `results`."""
    verdict = Verdict()
    for h, res in results.items():
        _judge_host(verdict, h, requirements[h], res, ports[h], sharing, describe_busy)
    return verdict


def _judge_host(
    verdict: Verdict,
    h: str,
    req: HostRequirements,
    res: dict[str, Any],
    ports: list[int],
    sharing: dict[str, list[str]],
    describe_busy: Callable[[str, list[int]], str],
) -> None:
    checks = verdict.checks
    if "error" in res:
        checks.append(
            Check(
                h,
                "reachable",
                False,
                res["error"],
                "check the address, SSH user/key and known_hosts in the profile",
            )
        )
        return
    checks.append(Check(h, "reachable", True, f"{res['arch']}, python {res['python3']}"))
    _judge_packages(verdict, h, req, res)
    for cmd, ok in res["commands"].items():
        checks.append(
            Check.judged(h, f"command {cmd}", ok,
                         "found", "not found", "install it or set the full path in the profile")
        )  # fmt: skip
    for path, ok in res["paths"].items():
        checks.append(
            Check.judged(h, f"path {path}", ok,
                         "exists", "missing", "copy the model there (same path on every host)")
        )  # fmt: skip
    busy = res["busy_ports"]
    checks.append(
        Check.judged(h, "ports free", not busy,
                     f"{len(ports)} ports free", describe_busy(h, busy),
                     "stop what holds them (`ss -ltnp`) or change the ports in the profile")
    )  # fmt: skip
    checks += _resource_checks(h, req, res)
    for d, info in res.get("shared", {}).items():
        checks.append(_storage_check(h, d, info, [p for p in sharing.get(d, []) if p != h]))


def _judge_packages(verdict: Verdict, h: str, req: HostRequirements, res: dict[str, Any]) -> None:
    checks = verdict.checks
    for need, info in zip(req.packages, res["packages"], strict=True):
        where = need.python.label
        if "error" in info:
            checks.append(
                Check(
                    h,
                    f"python {where}",
                    False,
                    info["error"][:200],
                    "install it or put its full path in the profile",
                )
            )
            continue
        for name, ver in info["v"].items():
            verdict.versions.setdefault(name, {})[h] = ver
            checks.append(
                Check(
                    h,
                    f"package {name}",
                    ver is not None,
                    ver or f"not importable by python {where}",
                    "" if ver else f"pip install {name} into the environment of python {where}",
                )
            )
        checks.append(Check(h, "site-packages", True, info["site"]))


def _resource_checks(h: str, req: HostRequirements, res: dict[str, Any]) -> list[Check]:
    """NPUs, the planner's compiler, memory and /dev/shm: each only where the plan needs it."""
    checks: list[Check] = []
    if req.npu:
        checks.append(
            Check.judged(h, "NPUs visible", bool(res.get("npu")),
                         "npu-smi info ok", "npu-smi info failed",
                         "install the Ascend driver / mount the devices into the container")
        )  # fmt: skip
    if req.clang_omp:
        ok = bool(res.get("clang") and res.get("omp_h"))
        checks.append(
            Check.judged(h, "clang + omp.h", ok,
                         "found", "missing", "apt-get install -y clang libomp-dev")
        )  # fmt: skip
    if req.memory_gb:
        checks.append(
            _space(h, "memory", res.get("mem_available"), req.memory_gb, "available",
                   "pools", "lower dram sizes or use a larger host")
        )  # fmt: skip
    if req.shm_gb:
        checks.append(
            _space(h, "/dev/shm", res.get("shm_free"), req.shm_gb, "free",
                   "UCM cache buffers", "enlarge /dev/shm (docker --shm-size)")
        )  # fmt: skip
    return checks


def _storage_check(h: str, d: str, info: dict[str, Any], peers: list[str]) -> Check:
    """A shared directory on `h`: present, writable, and showing the tokens `peers` wrote."""
    if not info["exists"] or not info["writable"]:
        return Check(
            h,
            f"storage {d}",
            False,
            "missing" if not info["exists"] else "not writable",
            "create/mount it with write access on every host",
        )
    missing = [p for p in peers if p not in info.get("sees", [])]
    return Check(
        h,
        f"storage {d}",
        not missing,
        "shared with " + (", ".join(peers) or "no other host")
        if not missing
        else f"does not see files written by {missing}",
        ""
        if not missing
        else "mount the same shared filesystem (NFS/3FS) at this path on every host",
    )


def version_mismatches(versions: Versions) -> list[Check]:
    """One failed check per package found in more than one version across the hosts."""
    checks: list[Check] = []
    for name, by_host in versions.items():
        found = {v for v in by_host.values() if v}
        if len(found) > 1:
            detail = ", ".join(f"{h}={v}" for h, v in sorted(by_host.items()))
            checks.append(
                Check(
                    "*",
                    f"same {name} everywhere",
                    False,
                    detail,
                    f"install one {name} version on every host",
                )
            )
    return checks


def _space(
    host: str, name: str, have_bytes: int | None, need_gb: float, state: str, user: str, fix: str
) -> Check:
    """Memory or /dev/shm: enough for what `user` needs? The same check with other words."""
    have = (have_bytes or 0) / GiB
    detail = f"{have:.0f} GiB {state}, {user} need {need_gb:g} GiB"
    return Check.judged(host, name, have >= need_gb, detail, detail, fix)
