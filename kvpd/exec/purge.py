"""`kvpd down --purge`: remove each host's run dir (node bundles, logs, rendered files) once the
deployment is stopped. A plain `down` keeps them, so the next `up` reuses the installed bundle.
Only a dir `up` marked as its own is touched, and in it only kvpd's entries (kvpd.exec.run_dirs)."""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from kvpd.exec import run_dirs
from kvpd.exec.fanout import Fanout
from kvpd.exec.state import DeploymentState
from kvpd.exec.transport import Transport
from kvpd.profile.types import shared_folder


def unsafe_run_dir(path: str) -> str | None:
    """Why `path` must not be removed recursively, or None. A run dir is a dedicated folder:
    never the root, a top-level folder or a home directory (the profile refuses those too)."""
    if not posixpath.isabs(posixpath.normpath(path)):
        return "it is not absolute"
    if shared_folder(path):
        return "it is a system or home folder"
    return None


def purge_run_dirs(
    state: DeploymentState, transports: Callable[[str], Transport]
) -> dict[str, str]:
    """Purge every recorded run dir; returns host -> problem for those not removed."""

    def one(item: tuple[str, str]) -> tuple[str, str]:
        host, path = item
        why = unsafe_run_dir(path)
        if why:
            return host, f"kept {path}: {why}"
        try:
            return host, run_dirs.purge(transports(host), path, state.plan, host)
        except Exception as e:  # noqa: BLE001 - reported per host
            return host, f"{path}: {e}"

    items = sorted(state.run_dirs.items())
    with Fanout(max(1, min(16, len(items)))) as pool:
        return {h: p for h, p in pool.map(one, items) if p}
