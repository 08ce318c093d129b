"""Whole-file reads and atomic writes over SFTP (temporary name + rename)."""

from __future__ import annotations

import posixpath
import stat as stat_mod
import uuid

import paramiko


def temp_name(target: str) -> str:
    parent, name = posixpath.split(target)
    return f"{parent}/.{name}.{uuid.uuid4().hex[:12]}.tmp"


def write_temp(sftp: paramiko.SFTPClient, tmp: str, content: bytes, mode: int) -> None:
    """Write `tmp` (creating its directories) with `mode`; the caller renames it into place."""
    makedirs(sftp, posixpath.dirname(tmp))
    with sftp.open(tmp, "wb") as f:
        f.set_pipelined(True)
        f.write(content)
    sftp.chmod(tmp, mode)


def discard(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except Exception:  # noqa: BLE001 - best effort; the link may be gone
        pass


def makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
    missing = []
    d = directory
    while d not in ("/", ""):
        try:
            if not stat_mod.S_ISDIR(sftp.stat(d).st_mode or 0):
                raise NotADirectoryError(f"{d} exists and is not a directory")
            break
        except FileNotFoundError:
            missing.append(d)
            d = posixpath.dirname(d)
    for d in reversed(missing):
        try:
            sftp.mkdir(d)
        except OSError:
            # Another writer may have created it meanwhile; anything else shows on write.
            pass


def read_all(sftp: paramiko.SFTPClient, path: str) -> bytes:
    with sftp.open(path, "rb") as f:
        f.prefetch()
        return f.read()
