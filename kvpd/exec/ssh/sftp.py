"""Whole-file reads and atomic writes over SFTP (temporary name + rename)."""

from __future__ import annotations

import posixpath
import stat as stat_mod
import uuid

import paramiko
from paramiko.sftp import CMD_HANDLE, CMD_OPEN, SFTP_FLAG_CREATE, SFTP_FLAG_EXCL, SFTP_FLAG_WRITE


def temp_name(target: str) -> str:
    parent, name = posixpath.split(target)
    return f"{parent}/.{name}.{uuid.uuid4().hex[:12]}.tmp"


def open_new(sftp: paramiko.SFTPClient, path: str, mode: int) -> paramiko.SFTPFile:
    """Create `path` for writing, new only (O_EXCL: never an existing file or a planted
    symlink), with permissions `mode` & 0o700 in the OPEN request itself, so no other user can
    read it while its content is written (SFTPClient.open sends no permissions: the server's
    default, 0666 less its umask). The caller sets the final mode after writing."""
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = mode & 0o700
    flags = SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL
    # SFTPClient.open has no way to send attributes: the request it makes, with them.
    t, msg = sftp._request(CMD_OPEN, path, flags, attrs)  # type: ignore[attr-defined]
    if t != CMD_HANDLE:
        raise paramiko.SFTPError("expected a handle")
    return paramiko.SFTPFile(sftp, msg.get_binary(), "wb")


def write_temp(sftp: paramiko.SFTPClient, tmp: str, content: bytes, mode: int) -> None:
    """Write `tmp` (creating its directories private) owner-only, then give it `mode`; the
    caller renames it into place."""
    makedirs(sftp, posixpath.dirname(tmp))
    with open_new(sftp, tmp, mode) as f:
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
            sftp.mkdir(d, mode=0o700)  # kvpd's own dirs: no other user lists or reads them
        except OSError:
            # Another writer may have created it meanwhile; anything else shows on write.
            pass


def read_all(sftp: paramiko.SFTPClient, path: str) -> bytes:
    with sftp.open(path, "rb") as f:
        f.prefetch()
        return f.read()
