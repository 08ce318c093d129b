"""Containers on the nodes, end to end on the SSH test bed: `ucm-centralized-2p2d`
rehearsed with every process of each host inside a container that kvpd starts there.

Docker and Podman cannot run containers on these machines, so the runtime is kvpd's namespace
STAND-IN (kvpd/testing/kvpd-standin-runtime: own mount and PID namespaces, entered with
nsenter, as a runtime's exec does). Checked: the node bundle is visible inside, the recorded
PIDs are the container's, a request through the proxy hands KV over, `status` and `logs` reach
inside, and `down` leaves nothing inside or outside (the container is gone too).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_ssh_rehearsal import (
    PROMPT,
    SHARED,
    Rehearsal,
    assert_down_leaves_nothing,
    complete,
    kvpd,
    metric,
    processes_on,
    rehearse,
    write_inventory,
)
from tests.testbed import Testbed
from tests.unit.standin import STANDIN, can_unshare

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

HOSTS = {"p1": "h1", "d1": "h2"}
NAME = "kvpd-ucm-centralized-2p2d"  # the default name of a container kvpd starts


@pytest.fixture(scope="module")
def rh(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
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


def test_a_failed_up_rolls_back_inside_and_removes_the_containers(
    bed: Testbed,
    tmp_path: Path,
) -> None:
    if not can_unshare():
        pytest.skip("the namespace stand-in needs root and unshare/nsenter")
    storage = SHARED / "ctr-fail" / "kv"  # below the repo: every bed host sees it
    storage.mkdir(parents=True, exist_ok=True)
    inv = write_inventory(tmp_path / "inventory.yaml", bed, HOSTS, storage)
    container = f'{{runtime: standin, image: standin, command: "{STANDIN}"}}'
    sets = [f"hosts.{h}.container={container}" for h in HOSTS]
    sets.append("rehearsal.vllm=/bin/false")  # every engine exits at once
    args = ["up", "ucm-centralized-2p2d", "--rehearse", "--inventory", str(inv), "--yes"]
    args += [a for s in sets for a in ("--set", s)]
    try:
        # Preflight (inside the containers `up` started for it) fails: they are removed again.
        r = kvpd(tmp_path / "state", *args, check=False)
        assert r.returncode != 0, r.stdout + r.stderr
        assert "preflight failed" in r.stderr, r.stdout + r.stderr
        assert {h: ps for h, ps in processes_on(bed, list(HOSTS.values())).items() if ps} == {}
        # Past preflight, the engines fail inside: `up` rolls back and removes the containers.
        r = kvpd(tmp_path / "state", *args, "--skip-preflight", check=False)
        assert r.returncode != 0, r.stdout
        assert "is stopped" in r.stdout + r.stderr, r.stdout + r.stderr
        assert {h: ps for h, ps in processes_on(bed, list(HOSTS.values())).items() if ps} == {}
    finally:
        kvpd(tmp_path / "state", "down", "ucm-centralized-2p2d", check=False, timeout=300)
        shutil.rmtree(SHARED / "ctr-fail", ignore_errors=True)


def test_exec_into_containers_the_user_runs_and_down_keeps_them(
    bed: Testbed,
    tmp_path: Path,
) -> None:
    """`container: {name: ...}`: kvpd only execs into the user's containers; `down` stops
    everything it started inside and leaves the containers running. The engines are kvpd's
    stand-in: the exec into a container and `down`'s verdict are what is checked here; CPU
    vLLM inside a container is the first test's."""
    from kvpd.exec.ssh import SSHTransport

    if not can_unshare():
        pytest.skip("the namespace stand-in needs root and unshare/nsenter")
    user_name = "users-vllm-ascend"
    hosts = {h: SSHTransport(bed.spec(b)) for h, b in HOSTS.items()}
    storage = SHARED / "ctr-exec" / "kv"
    storage.mkdir(parents=True, exist_ok=True)
    inv = write_inventory(tmp_path / "inventory.yaml", bed, HOSTS, storage)
    container = f'{{runtime: standin, name: {user_name}, command: "{STANDIN}"}}'
    args = ["up", "ucm-centralized-2p2d", "--rehearse-with", "standin", "--inventory", str(inv)]
    args += ["--yes", *[a for h in HOSTS for a in ("--set", f"hosts.{h}.container={container}")]]
    state = tmp_path / "state"
    try:
        for t in hosts.values():  # what the user does once per node
            r = t.run([STANDIN, "run", "-d", "--name", user_name, "standin"], timeout_s=60)
            assert r.ok, r.stderr
        r = kvpd(state, *args, "--json", check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert all(p["status"] == "healthy" for p in json.loads(r.stdout)["processes"])
        down = json.loads(kvpd(state, "down", "ucm-centralized-2p2d", "--json").stdout)
        assert down["clean"], down
        for h, t in hosts.items():
            r = t.run([STANDIN, "inspect", user_name], timeout_s=60)
            assert r.ok, (h, r.stdout, r.stderr)
            assert r.stdout.startswith("running"), (h, r.stdout, r.stderr)
            ps = t.run([STANDIN, "exec", user_name, "ps", "-eo", "pid=,args="], timeout_s=60)
            rows = [ln for ln in ps.stdout.splitlines() if ln.strip() and " ps -eo" not in ln]
            assert len(rows) == 1, (h, rows)  # the container's init only: nothing of kvpd's
    finally:
        kvpd(state, "down", "ucm-centralized-2p2d", check=False, timeout=300)
        for t in hosts.values():
            t.run([STANDIN, "rm", "-f", user_name], timeout_s=60)
            t.close()
        shutil.rmtree(SHARED / "ctr-exec", ignore_errors=True)
    assert {h: ps for h, ps in processes_on(bed, list(HOSTS.values())).items() if ps} == {}
