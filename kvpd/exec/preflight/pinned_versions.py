"""Preflight: the releases the layerwise guide pins, on the hosts that use them.

- MemFabric: `MEMFABRIC_HYBRID_EXTEND_LIB_PATH` names a release folder (the guide's
  `/usr/local/memfabric_hybrid/1.2.0/...`); the installed memfabric-hybrid must be that release,
  or the engine loads another build's libraries.
- memcache-hybrid is built against one MemFabric release (the guide pins its submodule to
  release/1.2): both must be the same major.minor on a host.
- The NPU driver: MemFabric 1.2 needs driver 25.5.1 or later (read from
  /usr/local/Ascend/driver/version.info, `Version=...`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kvpd.exec.preflight.checks import Check
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan

DRIVER_INFO = "/usr/local/Ascend/driver/version.info"
DRIVER_MIN = (25, 5, 1)
MEMFABRIC_USERS = ("MEMFABRIC_HYBRID_EXTEND_LIB_PATH", "MMC_LOCAL_CONFIG_PATH")
_RELEASE = re.compile(r"(?:^|/)(\d+)\.(\d+)\.(\d+)(?:/|$)")


def _numbers(text: str) -> tuple[int, ...]:
    """Leading numeric components: 25.5.1 -> (25, 5, 1), 24.1.rc3 -> (24, 1)."""
    out: list[int] = []
    for part in text.strip().split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def pinned_checks(
    plan: Plan,
    versions: dict[str, dict[str, str | None]],
    transports: Callable[[str], Transport],
    reached: set[str],
) -> list[Check]:
    """`versions`: package -> host -> installed version (the package probe's answers)."""
    checks: list[Check] = []
    lib_paths: dict[str, str] = {}
    users: set[str] = set()
    for p in plan.processes:
        env = dict(p.env)
        if p.host in reached and not p.substituted and any(k in env for k in MEMFABRIC_USERS):
            users.add(p.host)
            if "MEMFABRIC_HYBRID_EXTEND_LIB_PATH" in env:
                lib_paths[p.host] = env["MEMFABRIC_HYBRID_EXTEND_LIB_PATH"]
    for h in sorted(users):
        mf = versions.get("memfabric-hybrid", {}).get(h)
        mc = versions.get("memcache-hybrid", {}).get(h)
        m = _RELEASE.search(lib_paths.get(h, ""))
        if m and mf:
            pinned = ".".join(m.groups())
            ok = _numbers(mf)[:2] == tuple(int(x) for x in m.groups()[:2])
            checks.append(Check.judged(
                h, "memfabric release", ok, f"memfabric-hybrid {mf}, as MEMFABRIC_HYBRID_"
                f"EXTEND_LIB_PATH names ({pinned})", f"memfabric-hybrid {mf} is installed but "
                f"MEMFABRIC_HYBRID_EXTEND_LIB_PATH names {pinned} ({lib_paths[h]})",
                "set kv.memfabric.extend_lib_path to the installed release's lib64, or install "
                f"MemFabric {pinned}",
            ))  # fmt: skip
        if mf and mc:
            ok = _numbers(mf)[:2] == _numbers(mc)[:2]
            checks.append(Check.judged(
                h, "memcache/memfabric pair", ok, f"memcache-hybrid {mc} with memfabric-hybrid "
                f"{mf}", f"memcache-hybrid {mc} is not built for memfabric-hybrid {mf}",
                "install the memcache-hybrid release built against this MemFabric (same "
                "major.minor; the guide builds it with memfabric release/1.2)",
            ))  # fmt: skip
        if any(r.npu for n, r in plan.requirements.items() if n == h):
            checks.append(_driver(h, transports))
    return checks


def _driver(host: str, transports: Callable[[str], Transport]) -> Check:
    want = ".".join(map(str, DRIVER_MIN))
    try:  # obtaining the transport may fail too (host key, connection): no driver read
        r = transports(host).run(["cat", DRIVER_INFO], timeout_s=30)
        text = r.stdout if r.ok else ""
    except Exception:  # noqa: BLE001 - reachability is its own check
        text = ""
    found = next(
        (ln.split("=", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Version=")),
        None,
    )
    if found is None:
        fix = f"install the Ascend NPU driver {want} or later (MemFabric needs it)"
        return Check(host, "NPU driver", False, f"no Version= in {DRIVER_INFO}", fix)
    return Check.judged(
        host, "NPU driver", _numbers(found) >= DRIVER_MIN, f"driver {found}",
        f"driver {found} is older than {want}, which MemFabric 1.2 needs",
        f"upgrade the Ascend NPU driver to {want} or later",
    )  # fmt: skip
