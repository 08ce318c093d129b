"""Which wheel each group of bundle slots gets (pure): one per platform from the controller (its
own build, or its cross-build for aarch64) or a `bundle_builder` host, else one per host that can
build its own, else the NumPy fallback."""

from __future__ import annotations

from dataclasses import dataclass

from kvpd.exec.bundle.result import SlotResult

Group = tuple[str, str | None]  # (platform, None: every host of it | the one host served)


@dataclass(frozen=True)
class Build:
    """How the wheel of one group is obtained: "local", "cross" (cross-built on the controller),
    "cache" (the build of `hosts[0]`), "hosts" (build on `hosts` in order), or "any" (no build
    possible: the wheel without the native core)."""

    how: str
    hosts: tuple[str, ...] = ()


def choose_builds(
    missing: dict[str, list[tuple[str, bool]]],
    local_platform: str,
    cached: set[Group],
    builders: dict[str, tuple[str, ...]] | None = None,
    cross: frozenset[str] = frozenset(),
) -> dict[Group, Build]:
    """Per platform that some slot lacks (-> [(host, host has a compiler)] in plan order): one
    wheel for all its hosts (the controller's, or a builder host's: `builders` are the
    platform's `bundle_builder` hosts with a compiler, `cached` the (platform, host) builds in
    the cache), else each host with a compiler (or its own cached build) builds its own, the
    rest get the wheel without the native core. `cross`: the platforms the controller can
    cross-build for, whose hosts then need no compiler and get no host's build."""
    out: dict[Group, Build] = {}
    for platform, hosts in missing.items():
        mine = tuple((builders or {}).get(platform, ()))
        if platform == local_platform:
            out[(platform, None)] = Build("local")
        elif platform in cross:
            out[(platform, None)] = Build("cross")
        elif done := [b for b in mine if (platform, b) in cached]:
            out[(platform, None)] = Build("cache", (done[0],))
        elif mine:
            out[(platform, None)] = Build("hosts", mine)
        else:
            for h, cxx in dict.fromkeys(hosts):
                if (platform, h) in cached:
                    out[(platform, h)] = Build("cache", (h,))
                elif cxx:
                    out[(platform, h)] = Build("hosts", (h,))
            if any((platform, h) not in out for h, _ in hosts):
                out[(platform, None)] = Build("any")
    return out


def group_of(r: SlotResult, builds: dict[Group, Build]) -> Group:
    own = (r.report["platform"], r.host)
    return own if own in builds else (r.report["platform"], None)
