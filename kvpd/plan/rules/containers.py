"""Containers on the nodes: what a host's `container` setting needs to work."""

from __future__ import annotations

import posixpath

from kvpd.plan.rules.base import Checker

ASCEND = ("a2", "a3", "950")


def rule_containers(c: Checker) -> None:
    from kvpd.plan.container_hosts import host_container

    _groups_agree(c)
    for name, h in c.p.hosts.items():
        ct = host_container(c.p, name)
        if ct is None:
            continue
        path: tuple[str | int, ...] = ("hosts", name, "container")
        if h.container is None:  # from a group
            role = next(r for r, g in c.groups() if g.container is ct)
            path = (role, "container")
        if ct.name is None and ct.image is None:
            c.err(
                path,
                "give `name` (exec into a container you run) or `image` (kvpd starts one), "
                "e.g. {name: vllm-ascend, runtime: docker}.",
            )
        hardware = h.hardware or c.p.hardware
        if ct.runtime == "standin":
            if hardware in ASCEND:  # moot in a rehearsal, which runs on CPUs
                c.err(
                    (*path, "runtime"),
                    f"standin is kvpd's namespace stand-in for tests and passes no NPUs; "
                    f"host {name!r} is {hardware}: use docker or podman.",
                    on_hardware=True,
                )
            continue  # the stand-in keeps the host's root: every path is the same inside
        run_dir = h.run_dir or c.p.runtime.run_dir
        if run_dir is None or not posixpath.isabs(run_dir):
            c.err(
                (*path,),
                f"the run dir is mounted into the container at the same path, so it must be "
                f"absolute (is {run_dir or 'the default, relative to the login directory'!r})"
                f": set hosts.{name}.run_dir or runtime.run_dir to an absolute path, e.g. "
                "/data/kvpd/run.",
            )
        if ct.image is not None and not posixpath.isabs(c.p.model.path):
            c.err(
                ("model", "path"),
                f"host {name!r} starts a container from an image, which mounts the model "
                f"folder at the same path: model.path must be absolute (is "
                f"{c.p.model.path!r}).",
                on_hardware=True,  # a rehearsal serves its own tiny model
            )


def _groups_agree(c: Checker) -> None:
    """Groups sharing a host without a `container` of its own must ask for the same one."""
    seen: dict[str, tuple[str, object]] = {}
    for role, g in c.groups():
        if g.container is None:
            continue
        for host in g.hosts:
            if host not in c.p.hosts or c.p.hosts[host].container is not None:
                continue
            other = seen.setdefault(host, (role, g.container))
            if other[1] != g.container:
                c.err(
                    (role, "container"),
                    f"host {host!r} runs {other[0]} and {role} with different containers; "
                    f"one host runs one container: give them the same one or set "
                    f"hosts.{host}.container.",
                )
