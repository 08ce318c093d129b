"""Preflight of one owner per shared KV folder: the uid each host's engines run as (`id -u` through
the host's transport, so inside its container when it has one), compared among the hosts that
share a folder. The plan refuses different login names (kvpd/plan/kv_owner.py); this catches
what a plan cannot see: users ssh picks (~/.ssh/config's User, the controller's user), a
container's user, and one name with different uids on different nodes (a shared filesystem
checks uids, not names). KV files are private to the uid that writes them."""

from __future__ import annotations

from collections.abc import Callable

from kvpd.exec.fanout import Fanout
from kvpd.exec.preflight.checks import Check
from kvpd.exec.transport import Transport
from kvpd.plan.value import Plan

NAME = "one user for"


def owner_checks(
    plan: Plan, transports: Callable[[str], Transport], hosts: list[str], fan: Fanout
) -> list[Check]:
    """One check per KV folder that two or more of `hosts` share."""
    sharing: dict[str, list[str]] = {}
    for h in hosts:
        for d in plan.requirements[h].shared_dirs if h in plan.requirements else ():
            sharing.setdefault(d, []).append(h)
    sharing = {d: hs for d, hs in sharing.items() if len(hs) > 1}
    need = sorted({h for hs in sharing.values() for h in hs})
    outcomes = fan.each(lambda h: _uid(transports(h)), need, key=str)
    uids = {h: o.value for h, o in outcomes.items() if o.value is not None}
    return [_judge(d, {h: uids[h] for h in hs if h in uids}) for d, hs in sorted(sharing.items())]


def _judge(folder: str, uids: dict[str, str]) -> Check:
    by_uid: dict[str, list[str]] = {}
    for h, u in sorted(uids.items()):
        by_uid.setdefault(u, []).append(h)
    who = "; ".join(f"{', '.join(hs)} as uid {u}" for u, hs in sorted(by_uid.items()))
    return Check.judged(
        "*",
        f"{NAME} {folder}",
        len(by_uid) <= 1,
        f"every engine host as {who}" if by_uid else "uids unknown",
        f"{who}: KV files are private to the uid that writes them",
        "log in as one user (the same uid) on every host sharing the folder",
    )


def _uid(t: Transport) -> str | None:
    r = t.run(["id", "-u"], timeout_s=30)
    uid = r.stdout.strip()
    return uid if r.ok and uid.isdigit() else None
