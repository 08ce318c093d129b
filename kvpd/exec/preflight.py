"""Preflight: read-only checks on every host of a plan, one table with a fix hint per failure.

It verifies what `Plan.requirements` lists (derived by the planner): the host is reachable and
its key known; packages importable with versions identical across hosts; commands and model
paths present; the plan's ports free; NPUs visible; Clang + OpenMP where vLLM-Ascend's sparse
planner will be JIT-built (also where kvpd's plugin will not recognise the installed manager);
shared storage really shared (a token written on one host must be read on the others); enough
free memory and /dev/shm.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from kvpd.errors import KvpdError
from kvpd.exec.bundle import preflight as bundle_preflight
from kvpd.exec.channel_preflight import channel_checks
from kvpd.exec.checks import Check
from kvpd.exec.containers import preflight as container_preflight
from kvpd.exec.fanout import Fanout, HostOutcome
from kvpd.exec.owner_preflight import owner_checks
from kvpd.exec.pinned_versions import pinned_checks
from kvpd.exec.planner_gate import planner_checks
from kvpd.exec.probe import PROBE
from kvpd.exec.records.conflicts import port_holders
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan

GiB = 1 << 30


def _probe(t: Transport, req: dict[str, Any]) -> dict[str, Any]:
    r = t.run(["python3", "-c", PROBE, json.dumps(req)], timeout_s=180)
    if not r.ok:
        raise KvpdError(f"probe failed (exit {r.exit_code}): {r.stderr.strip()[-300:]}")
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def run_checks(plan: Plan, transports: Callable[[str], Transport]) -> list[Check]:
    """Probe every host in parallel (twice where storage must be shared) and judge the results."""
    token = secrets.token_hex(6)
    hosts = [h.name for h in plan.hosts if h.name in plan.requirements]
    ports = {h: sorted({u.port for u in plan.ports if u.host == h}) for h in hosts}
    sharing: dict[str, list[str]] = {}
    for h in hosts:
        for d in plan.requirements[h].shared_dirs:
            sharing.setdefault(d, []).append(h)

    def request(h: str, write: bool, cleanup: bool, full: bool = True) -> dict[str, Any]:
        need = plan.requirements[h]
        peers = sorted({p for d in need.shared_dirs for p in sharing[d] if p != h})
        req: dict[str, Any] = {"shared_dirs": list(need.shared_dirs)}
        if full:  # later rounds only look at the shared directories
            req.update(
                packages=[
                    {"path": p.python.path, "next_to": p.python.next_to, "names": list(p.names)}
                    for p in need.packages
                ],
                commands=list(need.commands),
                paths=list(need.paths),
                npu=need.npu,
                clang_omp=need.clang_omp,
            )
        req.update(ports=ports[h], token=token, host=h, write=write, cleanup=cleanup, peers=peers)
        return req

    def probe_all(
        round_hosts: list[str], write: bool, cleanup: bool, full: bool
    ) -> dict[str, HostOutcome[dict[str, Any]]]:
        return fan.each(
            lambda h: _probe(transports(h), request(h, write, cleanup, full)), round_hosts,
            key=str,
        )  # fmt: skip

    # Containers on the nodes first: their runtime, state, image and the run dir mount.
    checks: list[Check] = container_preflight.preflight_checks(plan, transports)
    with Fanout(min(16, max(1, len(hosts)))) as fan:
        results: dict[str, dict[str, Any]] = {
            h: o.value if o.value is not None else {"error": str(o.error)}
            for h, o in probe_all(hosts, write=True, cleanup=False, full=True).items()
        }
        if sharing:
            # Second round: who can read whose token. Only when every host has read, a third
            # round removes the tokens (removing them while reading raced with slower peers).
            # A failed later round leaves the first round's view (a token left behind is a
            # small hidden file; not worth failing).
            reached = [h for h in hosts if "error" not in results[h]]
            for h, o in probe_all(reached, write=False, cleanup=False, full=False).items():
                if o.value is not None:
                    results[h]["shared"] = o.value["shared"]
            probe_all(reached, write=False, cleanup=True, full=False)

    versions: dict[str, dict[str, str | None]] = {}
    for h in hosts:
        res = results[h]
        req = plan.requirements[h]
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
            continue
        checks.append(Check(h, "reachable", True, f"{res['arch']}, python {res['python3']}"))
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
                versions.setdefault(name, {})[h] = ver
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
                         f"{len(ports[h])} ports free", busy_detail(transports(h), busy),
                         "stop what holds them (`ss -ltnp`) or change the ports in the profile")
        )  # fmt: skip
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
        for d, info in res.get("shared", {}).items():
            peers = [p for p in sharing.get(d, []) if p != h]
            if not info["exists"] or not info["writable"]:
                checks.append(
                    Check(
                        h,
                        f"storage {d}",
                        False,
                        "missing" if not info["exists"] else "not writable",
                        "create/mount it with write access on every host",
                    )
                )
                continue
            missing = [p for p in peers if p not in info.get("sees", [])]
            checks.append(
                Check(
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
            )
    from kvpd.exec.versions import service_versions  # imports Check from here

    reached_hosts = {c.host for c in checks if c.name == "reachable" and c.ok}
    checks += service_versions(plan, transports, reached_hosts)
    checks += planner_checks(plan, transports, reached_hosts)
    checks += pinned_checks(plan, versions, transports, reached_hosts)
    with Fanout(min(16, max(1, len(reached_hosts)))) as fan:
        checks += channel_checks(sorted(reached_hosts), transports, fan)
        checks += owner_checks(plan, transports, sorted(reached_hosts), fan)
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
    if plan.bundle:  # node bundle: each slot's Python, pip, disk, native core per platform
        checks += bundle_preflight.preflight_checks(plan, transports)
    return checks


def busy_detail(t: Transport, busy: list[int]) -> str:
    """ "in use: [ports]", naming the kvpd process (deployment, who started it) that holds a
    port when its host's records say so (exec/records/conflicts.py)."""
    detail = f"in use: {busy}"
    try:
        holders = port_holders(t, list(busy)) if busy else {}
    except Exception:  # noqa: BLE001 - the names are a courtesy; the check stands without them
        holders = {}
    named = [f"{port} by {who}" for port, who in sorted(holders.items())]
    return detail + (f" ({'; '.join(named)})" if named else "")


def _space(
    host: str, name: str, have_bytes: int | None, need_gb: float, state: str, user: str, fix: str
) -> Check:
    """Memory or /dev/shm: enough for what `user` needs? The same check with other words."""
    have = (have_bytes or 0) / GiB
    detail = f"{have:.0f} GiB {state}, {user} need {need_gb:g} GiB"
    return Check.judged(host, name, have >= need_gb, detail, detail, fix)
