"""The lease on the local transport: the `local` profile (kvpd's stand-in engines) keeps its
lease in the user's home, so a change held elsewhere refuses `up`, and `--break-lease --yes`
takes the lease over; `up` releases it when it ends."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest

from kvpd.exec.lease.model import Holder, LeaseRecord
from tests.e2e.local_deploy import engine_missing, kvpd, local_sets, set_args

pytestmark = pytest.mark.e2e

NAME, PORT = "e2e-lease-local", 18690  # own deployment and ports


def test_a_held_lease_refuses_local_up_until_broken() -> None:
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    args = ["up", "local", "--rehearse-with", "standin", "--yes", "--no-canary"]
    args += set_args(local_sets(NAME, PORT))
    lease = Path.home() / ".kvpd" / "leases" / f"{NAME}.json"
    kvpd("down", "--deployment", NAME, "--break-lease", "--yes", check=False)
    # Another machine's kvpd holds it (its host name is not this one's: only expiry frees it).
    alice = Holder("alice", "laptop-a", 123, 1, "boot-x:1")
    lease.parent.mkdir(parents=True, exist_ok=True)
    lease.write_text(
        LeaseRecord(secrets.token_hex(16), alice, "up", int(time.time()), 120).render()
    )
    try:
        r = kvpd(*args, check=False)
        said = " ".join((r.stdout + r.stderr).split())
        assert r.returncode == 1, said
        assert f"deployment '{NAME}' is being changed by alice@laptop-a (kvpd pid 123, up)" in said
        assert "lease expires in" in said, said
        assert "(lease: localhost:~/.kvpd/leases/" in said, said
        kvpd(*args, "--break-lease")  # --yes answers the question
        assert not lease.exists()  # up released it when it ended
        rows = json.loads(kvpd("status", "--deployment", NAME, "--json").stdout)["processes"]
        assert rows, rows
        assert all(p["healthy"] for p in rows), rows
    finally:
        kvpd("down", "--deployment", NAME, check=False)
        lease.unlink(missing_ok=True)
