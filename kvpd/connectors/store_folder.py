"""The shared store folder, checked at startup: a missing or read-only mount fails with the fix."""

from __future__ import annotations

import os
import socket
import stat
import uuid
from pathlib import Path

from kvpd.errors import KvpdError


class StoreConfigError(KvpdError):
    """The store folder or the connector's settings are unusable; raised at startup."""

    exit_code = 2


def check_store_folder(root: str | os.PathLike[str]) -> Path:
    """Fail fast, with the fix in the message, if the shared folder is missing or read-only."""
    path = Path(root)
    hint = "point `kv.kvpd_store.path` (extra config `store_path`) at a writable shared folder"
    if not path.exists():
        raise StoreConfigError(
            f"KV store folder {path} does not exist. Create it on every host that runs an engine "
            f"(mkdir -p {path}; on a shared mount, mount it first) or {hint}."
        )
    if not path.is_dir():
        raise StoreConfigError(f"KV store path {path} is not a folder: {hint}.")
    mode = path.stat().st_mode
    # root ignores permission bits, so a folder nobody may write to is treated as read-only.
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
        raise StoreConfigError(
            f"KV store folder {path} is read-only (mode {stat.filemode(mode)}). Make it writable "
            f"for the engine's user (chmod u+w {path}; remount read-write) or {hint}."
        )
    probe = path / f".kvpd-probe-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise StoreConfigError(
            f"KV store folder {path} is not writable ({e.strerror}). Make it writable for the "
            f"engine's user or {hint}."
        ) from None
    return path
