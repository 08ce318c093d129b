"""The proxy's client key, orchestrator side.

The profile names a file on the controller (`proxy.client_key_file`), never the key: `up` reads
it and adds it to the plan it executes as a mode-0600 file on the proxy's host (the proxy reads
it with --client-key-file); the canary and `kvpd bench` read it again when they send requests.
It is one of the plan's secret values, so every serialised form of the plan masks it, and it
never appears on a command line. The file is trusted only if it is the user's own, a regular
file (no symlink) that nobody else can read or write.
"""

from __future__ import annotations

import dataclasses
import os
import stat

from kvpd.errors import DeployError
from kvpd.plan.processes import CLIENT_KEY_FILE
from kvpd.plan.value import FileSpec, Plan
from kvpd.profile.roles import Role

MIN_CHARS = 32  # as the proxy requires (kvpd.proxy.config.MIN_SECRET_CHARS)


def read(plan: Plan) -> str:
    """The key from `plan.client_key_file` ("" when the plan has none); DeployError with the
    fix when the file is missing, shared, or not one line of a key."""
    if not plan.client_key_file:
        return ""
    path = os.path.expanduser(plan.client_key_file)
    where = f"proxy.client_key_file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise DeployError(
            f"{where}: cannot read it ({e.strerror or e}); create it with "
            f"`umask 077; openssl rand -hex 32 > {path}`"
        ) from None
    try:
        st = os.fstat(fd)
        data = os.read(fd, 4096) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise DeployError(f"{where}: not a regular file")
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DeployError(
            f"{where}: mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}: it must be "
            f"yours and private; run `chmod 600 {path}`"
        )
    try:
        key = data.decode().strip()
    except UnicodeDecodeError:
        key = ""
    if len(key) < MIN_CHARS or any(c.isspace() or not c.isprintable() for c in key):
        raise DeployError(
            f"{where}: the key must be one line of at least {MIN_CHARS} printable characters "
            "without spaces (e.g. from `openssl rand -hex 32`)"
        )
    return key


def attach(plan: Plan) -> Plan:
    """`plan` with the client key file for its proxy (unchanged when it has no client key)."""
    key = read(plan)
    proxy = next((p for p in plan.processes if p.role == Role.PROXY), None)
    if not key or proxy is None:
        return plan
    f = FileSpec(proxy.host, CLIENT_KEY_FILE, key + "\n", 0o600, "client key")
    return dataclasses.replace(
        plan, files=(*plan.files, f), secret_values=(*plan.secret_values, key)
    )
