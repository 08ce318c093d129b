"""The wheel cache on the controller as a file store other local users cannot plant into.

A wheel in the cache is installed on every host of its platform, so the cache is trusted only
the way ssh trusts `~/.ssh`: every folder from the cache root down is owned by this user, is no
symbolic link and is writable by nobody else (kvpd creates them 0700); every file is read without
following a symbolic link and only when it is this user's and not writable by others. Files are
written create-new under a temporary name in the same folder and renamed into place, so a reader
sees a whole file or none, and nothing a planted link points at is ever written.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from kvpd.errors import KvpdError
from kvpd.exec.local import replace_with

# One path component the cache makes: never "", ".", "..", never a separator.
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}$")


class UnsafeCache(KvpdError):
    """The cache (or a file in it) could be changed by someone else: refused, with the fix."""


def component(name: str) -> str:
    if not _COMPONENT.fullmatch(name) or name in (".", ".."):
        raise UnsafeCache(f"{name!r} cannot be a folder or file name in kvpd's wheel cache")
    return name


def _check(path: Path, st: os.stat_result, what: str) -> None:
    fix = f"remove {path} (kvpd rebuilds what it needs) or make it yours: chown $USER {path}"
    if st.st_uid != os.getuid():
        raise UnsafeCache(f"{what} {path} belongs to uid {st.st_uid}, not to you: {fix}")
    if st.st_mode & 0o022:
        raise UnsafeCache(
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}), "
            f"so anyone could have put a wheel there that every host would run: check its "
            f"content, then chmod go-w {path}, or remove it"
        )


def _safe_component(path: Path, create: bool, *, is_root: bool) -> bool:
    """Check one folder of a cache path (made 0700 when `create`); False when it is missing
    and not `create`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return False
        os.mkdir(path, 0o700)
        st = os.lstat(path)
    if is_root and stat.S_ISLNK(st.st_mode):  # the root itself may be a link (~/.cache)
        st = os.stat(path)
    elif stat.S_ISLNK(st.st_mode):
        raise UnsafeCache(f"{path} in kvpd's wheel cache is a symbolic link: remove it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCache(f"{path} in kvpd's wheel cache is not a folder: remove it")
    _check(path, st, "the wheel cache folder")
    if create and stat.S_IMODE(st.st_mode) != 0o700:  # one an older kvpd made 0755
        os.chmod(path, 0o700)
    return True


def safe_dir(root: Path, *parts: str, create: bool = True) -> Path | None:
    """root/parts..., each component checked (and made 0700 when `create`); None when a
    component is missing and not `create`. Raises UnsafeCache for a link or a folder someone
    else can write."""
    path = root.expanduser().absolute()
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for i, name in enumerate(("", *(component(p) for p in parts))):
        if name:
            path = path / name
        if not _safe_component(path, create, is_root=i == 0):
            return None
    top = root.expanduser().absolute().resolve()
    if not path.resolve().is_relative_to(top):  # held by the checks above; stated again
        raise UnsafeCache(f"{path} is not inside kvpd's wheel cache {top}")
    return path


def read(folder: Path, name: str, limit: int) -> bytes | None:
    """The content of folder/name (None if missing), refusing a link, a file that is not this
    user's or writable by others, or one of more than `limit` bytes."""
    path = folder / component(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: a symbolic link
        raise UnsafeCache(
            f"{path} in kvpd's wheel cache cannot be read safely ({e}): remove it"
        ) from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeCache(f"{path} in kvpd's wheel cache is not a regular file: remove it")
        _check(path, st, "the cached file")
        if st.st_size > limit:
            raise UnsafeCache(f"{path} in kvpd's wheel cache is too big: remove it")
        return f.read(limit + 1)


def write(folder: Path, name: str, data: bytes) -> Path:
    """Put `data` at folder/name atomically: a new file (O_EXCL, O_NOFOLLOW, 0600) under a
    random temporary name in the same folder, renamed over the old one."""
    final = folder / component(name)
    tmp = folder / f".{name}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    replace_with(os.open(tmp, flags, 0o600), tmp, final, data)
    return final
