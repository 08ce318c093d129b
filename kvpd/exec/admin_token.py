"""The proxy's admin token, orchestrator side.

`up` makes a fresh token per deployment start, keeps it in `<state root>/<deployment>/
admin-token` (mode 0600) for `kvpd restart`, and adds it to the plan it executes as a mode-0600
file on the proxy's host (the proxy reads it with --admin-token-file). It is one of the plan's
secret values, so every serialised form of the plan (state.json, --json) masks it; it never
appears on a command line.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path

from kvpd.exec.local import private_dirs
from kvpd.plan.processes import ADMIN_TOKEN_FILE
from kvpd.plan.value import FileSpec, Plan
from kvpd.profile.roles import Role

TOKEN_FILE = "admin-token"


def needs_token(plan: Plan) -> bool:
    return any(p.role == Role.PROXY and ADMIN_TOKEN_FILE in p.command for p in plan.processes)


def path(root: Path, deployment: str) -> Path:
    return root / deployment / TOKEN_FILE


def issue(plan: Plan, root: Path) -> Plan:
    """`plan` with a fresh token file for its proxy (unchanged when its proxy takes none)."""
    if not needs_token(plan):
        return plan
    token = secrets.token_urlsafe(32)
    p = path(root, plan.deployment)
    private_dirs(p.parent)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    proxy = next(p for p in plan.processes if p.role == Role.PROXY)
    f = FileSpec(proxy.host, ADMIN_TOKEN_FILE, token + "\n", 0o600, "admin token")
    return dataclasses.replace(
        plan, files=(*plan.files, f), secret_values=(*plan.secret_values, token)
    )


def read(root: Path, deployment: str) -> str:
    """The token of `deployment`'s running proxy ("" when there is none)."""
    try:
        return path(root, deployment).read_text().strip()
    except FileNotFoundError:
        return ""
