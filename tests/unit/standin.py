"""The namespace stand-in of a container runtime (kvpd/testing/kvpd-standin-runtime) for
tests: a "container" around any transport, removed afterwards. Skips where the machine cannot
create mount and PID namespaces (not root, no unshare)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import kvpd
from kvpd.exec.containers.transport import ContainerTransport
from kvpd.exec.transport import Transport
from kvpd.plan.container import ContainerSpec

STANDIN = str(Path(kvpd.__file__).parent / "testing" / "kvpd-standin-runtime")


def can_unshare() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        return False
    r = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        check=False,
    )
    return r.returncode == 0


def spec(name: str | None = None, **kw: object) -> ContainerSpec:
    return ContainerSpec(
        runtime="standin", command=STANDIN, name=name or f"kvpd-t-{uuid.uuid4().hex[:8]}", **kw
    )  # type: ignore[arg-type]


@contextmanager
def standin_container(host: Transport, name: str | None = None) -> Iterator[ContainerTransport]:
    if not can_unshare():
        pytest.skip("the namespace stand-in needs root and unshare/nsenter")
    s = spec(name, image="standin", shm_gb=1, deployment="test")
    r = host.run(s.run_argv())
    assert r.ok, r.stderr
    try:
        yield ContainerTransport(host, s)
    finally:
        host.run(s.rm_argv())
