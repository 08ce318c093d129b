"""Containers on the nodes, end to end on the SSH test bed (issue 16): `ucm-centralized-2p2d`
rehearsed with every process of each host inside a container that kvpd starts there.

Docker and Podman cannot run containers on these machines, so the runtime is kvpd's namespace
STAND-IN (kvpd/testing/kvpd-standin-runtime: own mount and PID namespaces, entered with
nsenter, as a runtime's exec does). Checked: the node bundle is visible inside, the recorded
PIDs are the container's, a request through the proxy hands KV over, `status` and `logs` reach
inside, and `down` leaves nothing inside or outside (the container is gone too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Testbed
from tests.e2e.test_ssh_rehearsal import (
    PROMPT,
    Rehearsal,
    assert_down_leaves_nothing,
    complete,
    metric,
    rehearse,
)
from tests.e2e.test_ssh_rehearsal import bed as bed  # noqa: F401  (module fixture)
from tests.unit.standin import STANDIN, can_unshare

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

HOSTS = {"p1": "h1", "d1": "h2"}
NAME = "kvpd-ucm-centralized-2p2d"  # the default name of a container kvpd starts


@pytest.fixture(scope="module")
def rh(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:  # noqa: F811
    if not can_unshare():
        pytest.skip("the namespace stand-in needs root and unshare/nsenter")
    container = f'{{runtime: standin, image: standin, command: "{STANDIN}"}}'
    sets = [f"hosts.{h}.container={container}" for h in HOSTS]
    yield from rehearse(tmp_path_factory.mktemp("ctr"), bed, "ucm-centralized-2p2d", HOSTS, sets)


def inside(rh: Rehearsal, host: str, *argv: str) -> str:
    """Run argv inside `host`'s container (through the stand-in runtime on that bed host)."""
    from kvpd.exec.ssh import SSHTransport

    t = SSHTransport(rh.bed.spec(HOSTS[host]))
    try:
        r = t.run([STANDIN, "exec", NAME, *argv], timeout_s=60)
    finally:
        t.close()
    assert r.ok, f"{argv}: {r.stderr}"
    return r.stdout


def test_everything_runs_inside_and_down_leaves_nothing(rh: Rehearsal) -> None:
    assert all(p["status"] == "healthy" for p in rh.up["processes"]), rh.up
    state = json.loads((rh.state_dir / rh.name / "state.json").read_text())
    for rec in state["processes"]:
        # The PID recorded is the container's: that process, seen inside, is the one started.
        environ = inside(rh, rec["host"], "cat", f"/proc/{rec['pid']}/environ")
        assert f"KVPD_PROCESS={rec['name']}\x00" in environ, rec["name"]
    bundled = {u["host"] for u in state["plan"]["bundle"]}
    assert bundled  # the proxy's host at least
    for host in bundled:  # the node bundle, installed over SFTP on the host, is there inside
        run_dir = state["run_dirs"][host]
        assert inside(rh, host, "ls", f"{run_dir}/bundle").split(), host
    decodes = [rh.url("decode-0"), rh.url("decode-1")]

    def transferred() -> float:
        src = "vllm:prompt_tokens_by_source_total"
        return sum(metric(d, src, source="external_kv_transfer") for d in decodes)

    before = transferred()
    for i in range(2):
        complete(rh, f"{PROMPT} request {i}")
    assert transferred() - before >= 32
    rows = json.loads(rh.kvpd("status", rh.name, "--json").stdout)["processes"]
    assert all(r["alive"] and r["healthy"] for r in rows), rows
    log = rh.kvpd("logs", "decode-1", "-n", "1000").stdout
    assert "Application startup complete" in log or "Uvicorn running" in log, log[-2000:]
    assert_down_leaves_nothing(rh)  # no process on any bed host: the containers are gone too
