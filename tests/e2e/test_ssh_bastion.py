"""kvpd on a bed like a cluster behind a login node (scripts/testbed.sh TOPOLOGY=bastion): this
machine reaches only the bastion's sshd; the cluster hosts sit on a bridge it has no address or
route on (an `unreachable` route for their prefix), h1..h4 are logged into as a user that is not
root (h5 as root), and h5's sshd forbids TCP forwarding.

`up --rehearse-with standin` of ucm-centralized-2p2d goes through `ssh.jump`: health gate,
canary (/metrics and the completion through SSH channels), `status`, `logs`, `diagnose`, a
rolling restart of a decoder (drain and admit at the proxy through the channel) and of the
proxy, `forward` with a real request from this machine, and `down` leaving nothing. Then the
CPU-vLLM rehearsal, the one 4-host CPU-vLLM rehearsal of this profile: placement as the spread
asks, the canary's P→D proof and output check, `status` and `logs` of remote processes, and
`kvpd bench` with its client on the proxy's host, its proof from /metrics read through channels.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpd.exec.ssh import SSHTransport
from kvpd.plan.value import HostSpec
from tests.e2e.test_ssh_rehearsal import (
    MODEL,
    MOONCAKE,
    SERVICES_PY,
    VLLM,
    kvpd,
    kvpd_cmd,
    kvpd_env,
    processes_on,
)
from tests.testbed import REPO, TESTBED_SH, testbed_unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

PROFILE = "ucm-centralized-2p2d"
BED_HOSTS = 5  # h1..h4 serve; h5's sshd forbids forwarding
HOSTS = {"p1": "h1", "d1": "h2", "p2": "h3", "d2": "h4"}
NO_FORWARD = "h5"
# Logged into as the bed's user that is not root (run dirs in its home, no sudo); h5 as root.
NONROOT = ("1", "2", "3", "4")
SHARED = REPO / ".kvpd" / "e2e-bastion"


@dataclass(frozen=True)
class BastionBed:
    dir: Path
    jump: str  # user@address of the bastion
    hosts: dict[str, tuple[str, str]]  # hN -> (address, login user)
    key: str
    known_hosts: str

    def spec(self, h: str) -> HostSpec:
        address, user = self.hosts[h]
        return HostSpec(h, address, user=user, key=self.key, known_hosts=self.known_hosts,
                        jump=self.jump)  # fmt: skip


def _bed_env() -> dict[str, str]:
    import sys

    env = {**os.environ, "TOPOLOGY": "bastion", "PYTHON": sys.executable}
    env.update(NONROOT=" ".join(NONROOT), NOFORWARD=NO_FORWARD.removeprefix("h"))
    env.pop("KVPD_TESTBED_DIR", None)
    return env


@pytest.fixture(scope="module")
def bastion() -> Iterator[BastionBed]:
    why = testbed_unavailable()
    if why:
        pytest.skip(why)
    if not SERVICES_PY.exists():
        pytest.skip(f"{SERVICES_PY} is missing (run `make services`)")
    r = subprocess.run(["bash", str(TESTBED_SH), "up", str(BED_HOSTS)], env=_bed_env(),
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    if r.returncode != 0:
        pytest.fail(f"testbed.sh up (bastion) failed:\n{r.stdout}\n{r.stderr}")
    d = REPO / ".kvpd" / "testbed-bastion"
    rows = [ln.split() for ln in (d / "hosts").read_text().splitlines() if ln.strip()]
    address, user = (d / "jump").read_text().split()
    try:
        yield BastionBed(d, f"{user}@{address}", {h: (a, u) for h, a, u, _ in rows},
                         str(d / "id_ed25519"), str(d / "known_hosts"))  # fmt: skip
    finally:
        if not os.environ.get("KVPD_TESTBED_KEEP"):
            subprocess.run(["bash", str(TESTBED_SH), "down"], env=_bed_env(),
                           capture_output=True, timeout=120)  # fmt: skip


def inventory(
    path: Path, bed: BastionBed, hosts: dict[str, str], storage: Path, devices: int | None = None
) -> Path:
    extra = {"devices": devices} if devices is not None else {}
    data: dict[str, Any] = {
        "hosts": {
            name: {"address": bed.hosts[h][0], "ssh": {"user": bed.hosts[h][1]}, **extra}
            for name, h in hosts.items()
        },
        "ssh": {"key": bed.key, "known_hosts": bed.known_hosts, "jump": bed.jump},
        "rehearsal": {"model": str(MODEL), "vllm": str(VLLM), "python": str(SERVICES_PY),
                      "mooncake_master": str(MOONCAKE), "storage": str(storage)},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def leftovers(bed: BastionBed, hosts: list[str]) -> dict[str, list[str]]:
    """What runs on each host besides sshd and this very `ps`, through the bastion (the open
    bed's listing, by this bed's host specs)."""
    return {h: ps for h, ps in processes_on(bed, hosts).items() if ps}


def complete_through_forward(state: Path) -> dict[str, Any]:
    """`kvpd forward` on a free port here, one completion through it, then stop it."""
    proc = subprocess.Popen(kvpd_cmd("forward", PROFILE, "--port", "0"), cwd=state.parent,
                            env=kvpd_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("Forwarding http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[1]
        model = json.loads((state / PROFILE / "state.json").read_text())["plan"]["served_model"]
        req = urllib.request.Request(
            url + "/v1/completions",
            data=json.dumps({"model": model, "prompt": "hello " * 40, "max_tokens": 4}).encode(),
            headers={"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=60) as resp:
            assert resp.status == 200
            return json.loads(resp.read())  # type: ignore[no-any-return]
    finally:
        proc.terminate()  # the process this test started, by its PID
        proc.wait(timeout=30)


def check_placement_status_and_logs(state: Path) -> None:
    """Every instance on its own host as the spread asks, `status` reaching each remote process
    (alive, healthy, listening on its ports) and `logs` reading a decoder's log from its host's
    private home, all through the bastion."""
    rows = json.loads(kvpd(state, "status", PROFILE, "--json").stdout)["processes"]
    where = {p["name"]: p["host"] for p in rows}
    assert where == {"prefill-0": "p1", "prefill-1": "p2", "decode-0": "d1", "decode-1": "d2",
                     "proxy": "p1"}, rows  # fmt: skip
    bad = [p for p in rows if not (p["alive"] and p["healthy"])]
    assert not bad, bad
    assert all(p["listening"] == p["ports"] for p in rows), rows
    log = kvpd(state, "logs", "decode-1", "--deployment", PROFILE, "-n", "100000").stdout
    assert f"=== kvpd: {PROFILE}/decode-1 started" in log, log[-2000:]
    assert "ExampleConnector" in log or "kv_consumer" in log, log[-2000:]
    path = next(p["log"] for p in rows if p["name"] == "decode-1")
    assert path.startswith("/home/kvpd/"), path  # d2's login home: reachable only over SSH


def test_the_controller_reaches_only_the_bastion(bastion: BastionBed) -> None:
    """The premise of this module: no socket from here reaches a cluster host."""
    address = bastion.hosts["h1"][0]
    with pytest.raises(OSError):
        socket.create_connection((address, 22), timeout=3).close()
    t = SSHTransport(bastion.spec("h2"))
    try:
        r = t.run(["id", "-un"])
        assert r.ok
        assert r.stdout.strip() == "kvpd"
        assert t.resolve(".") == "/home/kvpd"
        # the connection's first session (which makes sshd set TCP_NODELAY) printed it
        assert t._connection().login_dir == "/home/kvpd"
    finally:
        t.close()


def test_forbidden_forwarding_is_found_by_preflight(bastion: BastionBed, tmp_path: Path) -> None:
    hosts = {**HOSTS, "d1": NO_FORWARD}  # the decoders' host
    inv = inventory(tmp_path / "inventory.yaml", bastion, hosts, SHARED / "refused")
    state = tmp_path / "state"
    state.mkdir()
    r = kvpd(state, "up", PROFILE, "--rehearse-with", "standin", "--inventory", str(inv),
             "--yes", check=False, timeout=600)  # fmt: skip
    text = r.stdout + r.stderr
    assert r.returncode != 0, text
    # the preflight table wraps the cells: each part on its line
    assert "channel refused by d1's sshd" in text, text
    assert "(AllowTcpForwarding no?)" in text, text
    assert "`AllowTcpForwarding local`" in text, text
    assert "Traceback" not in text, text
    assert "open FAILED" not in text, text
    assert leftovers(bastion, list(hosts.values())) == {}


@pytest.fixture(scope="module")
def deployed(bastion: BastionBed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("bastion")
    storage = SHARED / "standin"
    storage.mkdir(parents=True, exist_ok=True)
    storage.chmod(0o1777)  # the non-root login of d1 writes there too
    SHARED.chmod(0o755)
    inventory(tmp / "inventory.yaml", bastion, HOSTS, storage)
    state = tmp / "state"
    state.mkdir()
    try:
        yield state
    finally:
        kvpd(state, "down", PROFILE, check=False, timeout=300)
        shutil.rmtree(SHARED, ignore_errors=True)


def test_up_status_logs_restart_diagnose_down_through_the_bastion(
    bastion: BastionBed, deployed: Path
) -> None:
    state = deployed
    inv = state.parent / "inventory.yaml"
    t0 = time.monotonic()
    r = kvpd(state, "up", PROFILE, "--rehearse-with", "standin", "--inventory", str(inv),
             "--yes", check=False, timeout=600)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "P→D KV handover verified" in out or "Canary:" in out, out
    up_s = time.monotonic() - t0

    st = json.loads(kvpd(state, "status", PROFILE, "--json").stdout)
    rows = st["processes"]
    assert rows, rows
    # name, host, alive, healthy and detail of each (alive None: the host could not be asked,
    # and detail says why)
    seen = [(p["name"], p["host"], p["alive"], p["healthy"], p.get("detail")) for p in rows]
    assert all(p["alive"] and p["healthy"] is not False for p in rows), seen
    assert any(p["host"] == "d1" for p in rows)

    log = kvpd(state, "logs", "decode-0", "--deployment", PROFILE, "-n", "50").stdout
    assert log.strip(), "empty log of decode-0"

    body = complete_through_forward(state)
    assert body["usage"]["completion_tokens"] == 4, body

    r = kvpd(state, "restart", PROFILE, "decode-0", check=False, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restarted decode-0" in r.stdout, r.stdout
    assert "drained" in r.stdout, r.stdout
    r = kvpd(state, "restart", PROFILE, "proxy", check=False, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr

    r = kvpd(state, "diagnose", PROFILE)
    archive = Path(r.stdout.split("Archive:", 1)[1].split()[0])
    with tarfile.open(archive) as tar:
        summary = tar.extractfile(next(n for n in tar.getnames() if n.endswith("summary.txt")))
        assert summary is not None
        text = summary.read().decode()
    assert "healthy" in text, text
    assert "unhealthy" not in text, text

    r = kvpd(state, "down", PROFILE, "--json", check=False, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["clean"], r.stdout
    assert leftovers(bastion, list(HOSTS.values())) == {}
    print(f"up through the bastion: {up_s:.1f}s")


def test_cpu_vllm_rehearsal_and_bench_through_the_bastion(
    bastion: BastionBed, tmp_path: Path
) -> None:
    """The CPU-vLLM rehearsal through `ssh.jump`: the canary proves the P→D hand-over from
    /metrics read through channels, and `kvpd bench` runs its client on the proxy's host (this
    machine has no route to it), its proof from /metrics through channels too."""
    if not VLLM.exists() or not (MODEL / "config.json").exists():
        pytest.skip("the CPU engine or the tiny model is missing (make engine model)")
    storage = SHARED / "vllm"
    storage.mkdir(parents=True, exist_ok=True)
    storage.chmod(0o1777)
    # One engine per host, as the CPU-vLLM rehearsal of the open bed runs it. Every engine
    # shares the hand-over folder, so all log in as the bed's non-root user (a service account,
    # as on a cluster): KV files are private to their writer, and kvpd refuses a plan whose
    # engines would share the folder as different users (tests/unit/test_kv_owner.py).
    hosts = {"p1": "h1", "d1": "h2", "p2": "h3", "d2": "h4"}
    assert {bastion.hosts[h][1] for h in hosts.values()} == {"kvpd"}
    inv = inventory(tmp_path / "inventory.yaml", bastion, hosts, storage, devices=4)
    state = tmp_path / "state"
    state.mkdir()
    spread = ["--set", "prefill.hosts=[p1,p2]", "--set", "decode.hosts=[d1,d2]"]
    try:
        r = kvpd(state, "up", PROFILE, "--rehearse", "--inventory", str(inv), *spread, "--yes",
                 "--json", check=False, timeout=1200)  # fmt: skip
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        canary = json.loads(r.stdout)["canary"]
        assert "P→D KV handover verified" in canary["line"], canary
        # The canary's output check (ExampleConnector in place of UCM): the proxy's P/D
        # completions equal a prefill engine's own, each prompt's pair ending at a decoder.
        outputs = canary["outputs"]
        assert outputs["ok"], outputs
        assert outputs["summary"] == "outputs: 4/4 identical (first 16 tokens)", outputs
        pairs = {p["pair"] for p in outputs["prompts"]}
        assert all(" -> decode-" in pair for pair in pairs), pairs
        check_placement_status_and_logs(state)
        # no --set: the running deployment (its recorded plan) is what is benchmarked
        r = kvpd(state, "bench", PROFILE, "--protocol", "twice", "--num-prompts", "4",
                 "--input-len", "128", "--output-len", "4", "--results", str(tmp_path / "b"),
                 "--tokenizer", str(MODEL),
                 "--json", "--no-charts", check=False, timeout=1200)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        run = json.loads(r.stdout)
        assert run["ok"], run
        assert run["client"].startswith("p1, the proxy's host"), run["client"]
    finally:
        r = kvpd(state, "down", PROFILE, "--json", check=False, timeout=300)
        shutil.rmtree(storage, ignore_errors=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["clean"], r.stdout + r.stderr
    assert leftovers(bastion, list(hosts.values())) == {}
