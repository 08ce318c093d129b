"""Warnings about settings that start but do not do what they seem to (pure)."""

from __future__ import annotations

from kvpd.plan.requirements import ucm_shm_gb
from kvpd.plan.rules.base import Checker
from kvpd.profile.types import on_this_machine

TMPFS = ("/dev/shm", "/run/shm", "/tmp")  # per-host memory filesystems (tmp: often tmpfs)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def rule_store_sharing(c: Checker) -> None:
    u = c.p.kv.ucm
    ucm_hosts = sorted({h for _, g in c.groups() if "ucm" in g.kv_connectors for h in g.hosts})
    pd = c.f.group("prefill") is not None and c.f.group("decode") is not None
    if u is not None and pd and len(ucm_hosts) > 1:
        for d in u.storage.split(":"):
            if any(_under(d, t) for t in TMPFS[:2]):
                c.warn(
                    ("kv", "ucm", "storage"),
                    f"{d} is a per-host memory filesystem, but P/D runs across "
                    f"{', '.join(ucm_hosts)}: decode reads a different {d} from the one "
                    "prefill writes. Use one shared filesystem (NFS/3FS) at the same path.",
                )
    st = c.p.kv.kvpd_store
    if st is None:
        return
    users = sorted({h for _, g in c.groups() if "kvpd_store" in g.kv_connectors for h in g.hosts})
    machines = {  # hosts on this machine (local transport, loopback) share its filesystem
        "this machine" if on_this_machine(h.transport, h.address) else h.address
        for h in (c.p.hosts[n] for n in users if n in c.p.hosts)
    }
    if len(machines) > 1:
        c.warn(
            ("kv", "kvpd_store", "path"),
            f"{st.path} is used by {', '.join(users)}, which must then see one folder: mount "
            "one shared filesystem (NFS/3FS) there on each of them (`kvpd plan --check` "
            "verifies it), or the store only hits on the host that wrote a block.",
        )


def rule_model_lengths(c: Checker) -> None:
    p, d = c.f.group("prefill"), c.f.group("decode")
    if p is None or d is None or p.max_model_len is None or d.max_model_len is None:
        return
    if d.max_model_len < p.max_model_len:
        c.warn(
            ("decode", "max_model_len"),
            f"decode max_model_len {d.max_model_len} is below prefill's {p.max_model_len}: "
            "prompts prefill accepts are refused at decode after their prefill. Use one "
            "max_model_len (model.max_model_len) for both.",
        )


def rule_prefix_seed(c: Checker) -> None:
    b = c.p.bench
    if b.protocol != "prefix":
        return
    seeded = max(1, int(b.input_len * b.prefix_ratio + 1e-9))  # as kvpd.bench.runner seeds
    blocks = [g.block_size for g in c.gfacts()]
    if blocks and seeded < min(blocks):
        c.warn(
            ("bench", "input_len"),
            f"the prefix protocol seeds {seeded} tokens ({b.input_len} x {b.prefix_ratio:g}), "
            f"less than one KV block of {min(blocks)}: nothing can be cached, so the measured "
            f"run shows no reuse. Raise bench.input_len to at least "
            f"{-(-min(blocks) // b.prefix_ratio):.0f}.",
        )


def rule_container_shm(c: Checker) -> None:
    from kvpd.plan.container_hosts import host_container

    need: dict[str, float] = {}
    for p in c.procs:
        g = c.p.group(p.role) if p.role in ("prefill", "decode", "mixed") else None
        if g is not None and "ucm" in g.kv_connectors:
            need[p.host] = need.get(p.host, 0.0) + ucm_shm_gb(c.p, len(p.devices), g.tp * g.pp)
    for h, gb in sorted(need.items()):
        ct = host_container(c.p, h)
        if ct is None or ct.shm_gb is None or ct.shm_gb >= gb:
            continue
        path: tuple[str, ...] = ("hosts", h, "container", "shm_gb")
        if c.p.hosts[h].container is None:  # the group's container
            role = next(r for r, g in c.groups() if g.container is ct)
            path = (role, "container", "shm_gb")
        c.warn(
            path,
            f"shm_gb {ct.shm_gb:g} is below the {gb:g} GiB of /dev/shm UCM's cache buffers "
            f"need on '{h}'; they would fail to map. Raise shm_gb to {gb + 1:g} or leave it "
            "unset (kvpd sizes it).",
        )


def rule_proxy_waits(c: Checker) -> None:
    px = c.p.proxy
    if px is None or c.f.proxy_flow != "layerwise":
        return
    fb, pf = px.first_byte_timeout_s, px.prefill_timeout_s
    if fb is not None and (pf is None or fb < pf):
        c.warn(
            ("proxy", "first_byte_timeout_s"),
            f"first_byte_timeout_s {fb:g} is below prefill_timeout_s "
            f"{'(no limit)' if pf is None else f'{pf:g}'}: in the layerwise flow a decoder's "
            "first byte waits for the whole prefill, so this cuts requests whose prefill is "
            "still allowed. Raise it to at least prefill_timeout_s, or leave it unset.",
        )
