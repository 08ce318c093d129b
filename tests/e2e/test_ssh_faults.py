"""Faults during a multi-host `kvpd up` on the SSH test bed: a host that dies half way, a
service that never becomes healthy, an unknown host key, and `down` from the state file after
the `kvpd up` process itself was killed.

The engines here are a fake (a script that prints a line and sleeps, never serving /health) so
the tests are fast; everything else (plan, SSH transport, executor, rollback) is real.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpd.exec.records.model import RECORD_FILE
from kvpd.exec.ssh import SSHTransport
from tests.e2e.test_ssh_rehearsal import (
    SHARED,
    UCM4_HOSTS,
    kvpd,
    kvpd_cmd,
    kvpd_env,
    processes_on,
    write_inventory,
)
from tests.testbed import TESTBED_HOSTS, TESTBED_SH, Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

PROFILE = "ucm-centralized-2p2d"
SPREAD = ["--set", "prefill.hosts=[p1,p2]", "--set", "decode.hosts=[d1,d2]"]
FAKE_ENGINE = """#!{python}
# Fake vLLM for kvpd's fault tests: never serves /health, so `up` waits on it.
import sys, time
print("fake engine: loading weights for", " ".join(sys.argv[1:4]), flush=True)
print("fake engine: still loading (this fake never becomes healthy)", flush=True)
while True:
    time.sleep(3600)
"""


def fake_engine_in(d: Path) -> Iterator[Path]:
    """The fake engine script in folder `d` of the shared repo tree (so every bed host runs the
    same file), for a module fixture to yield from; `d` is removed afterwards."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "fake-vllm-never-healthy"
    path.write_text(FAKE_ENGINE.format(python=sys.executable))
    path.chmod(0o755)
    yield path
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def fake_engine() -> Iterator[Path]:
    yield from fake_engine_in(SHARED / "faults")


def inventory(
    tmp: Path,
    bed: Testbed,
    fake: Path,
    hosts: dict[str, str],
    *,
    health_timeout_s: float = 300,
    known_hosts: str | None = None,
) -> Path:
    return write_inventory(
        tmp / "inventory.yaml",
        bed,
        hosts,
        SHARED / "faults" / "kv",
        known_hosts=known_hosts,
        devices=4,
        rehearsal={"vllm": str(fake), "health_timeout_s": health_timeout_s},
    )


def up_args(inv: Path) -> list[str]:
    # Callers add --skip-preflight unless they test it: the fake is no vLLM installation.
    return ["up", PROFILE, "--rehearse", "--inventory", str(inv), *SPREAD, "--yes"]


def start_up(state_dir: Path, inv: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        kvpd_cmd(*up_args(inv), "--skip-preflight", "--grace", "5"),
        cwd=state_dir.parent,
        env=kvpd_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_records(
    state_dir: Path, n: int, proc: subprocess.Popen[str], within_s: float = 120
) -> dict:
    """The saved state once it records `n` started processes, and their hosts' records do too:
    `up` saves each start locally first and then writes its host's record, the one `status`,
    `diagnose` and `down` read, so a kill between the two would leave the host silent."""
    path = state_dir / PROFILE / "state.json"
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"kvpd up exited early ({proc.returncode}):\n{out}\n{err}")
        try:
            state = json.loads(path.read_text())
            if len(state["processes"]) >= n and _hosts_record(state_dir) >= n:
                return state
        except (FileNotFoundError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{n} processes were not recorded within {within_s}s")


def _hosts_record(state_dir: Path) -> int:
    """How many processes `kvpd status` (the hosts' records) names."""
    r = kvpd(state_dir, "status", PROFILE, "--json", check=False)
    return len(json.loads(r.stdout)["processes"]) if r.returncode == 0 else 0


def killed_once_recorded(state_dir: Path, inv: Path, n: int) -> dict:
    """`up`, SIGKILLed once it has recorded `n` processes (no rollback, no goodbye: only the
    state file and the host records remain); the state it had saved."""
    proc = start_up(state_dir, inv)
    try:
        return wait_for_records(state_dir, n, proc)
    finally:
        proc.kill()
        proc.communicate()


def busy(bed: Testbed, hosts: list[str]) -> dict[str, list[str]]:
    return {h: ps for h, ps in processes_on(bed, hosts).items() if ps}


def test_service_never_healthy_fails_with_its_log_tail(
    bed: Testbed, fake_engine: Path, tmp_path: Path
) -> None:
    hosts = {"p1": "h1", "d1": "h2", "p2": "h3", "d2": "h4"}
    inv = inventory(tmp_path, bed, fake_engine, hosts, health_timeout_s=3)
    state_dir = tmp_path / "state"
    r = kvpd(state_dir, *up_args(inv), "--skip-preflight", "--grace", "5", check=False)
    out = r.stdout + r.stderr
    print(r.stderr)  # the message a user sees (pytest -s)
    assert r.returncode != 0, out
    assert "did not become healthy within 3s" in out, out
    assert "on host " in out, out
    assert "Last " in out, out
    assert "| fake engine: still loading (this fake never becomes healthy)" in out, out
    assert "is stopped" in out, out  # the rollback's verdict
    assert busy(bed, list(hosts.values())) == {}


def test_unknown_host_key_is_refused_with_its_fingerprint(
    bed: Testbed, fake_engine: Path, tmp_path: Path
) -> None:
    addr = bed.addresses["h2"]
    partial = tmp_path / "known_hosts"
    lines = Path(bed.known_hosts).read_text().splitlines()
    partial.write_text("".join(ln + "\n" for ln in lines if not ln.startswith(addr + " ")))
    hosts = {"p1": "h1", "d1": "h2", "p2": "h3", "d2": "h4"}
    inv = inventory(tmp_path, bed, fake_engine, hosts, known_hosts=str(partial))
    fp = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", bed.host_key_pub("h2")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]

    # Through the executor: nothing is started anywhere.
    r = kvpd(tmp_path / "state", *up_args(inv), "--skip-preflight", check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "unknown host key" in out, out
    assert fp in out, out
    assert "host d1" in out, out
    assert "--accept-new-host-keys" in out, out
    assert busy(bed, list(hosts.values())) == {}
    # Through the preflight (the default): the failed check carries the same fingerprint.
    r = kvpd(tmp_path / "state", *up_args(inv), "--json", check=False)
    assert r.returncode != 0
    checks = json.loads(r.stdout)["checks"]
    d1 = [c for c in checks if c["host"] == "d1" and not c["ok"]]
    assert d1, checks
    assert fp in d1[0]["detail"], checks
    assert Path(partial).read_text().count(addr) == 0  # nothing was accepted silently


def test_host_killed_during_up_rolls_back_and_names_it(
    bed: Testbed, fake_engine: Path, tmp_path: Path
) -> None:
    inv = inventory(tmp_path, bed, fake_engine, UCM4_HOSTS)
    state_dir = tmp_path / "state"
    proc = start_up(state_dir, inv)
    victim = UCM4_HOSTS["p2"]  # bed host h3
    try:
        wait_for_records(state_dir, 4, proc)  # every engine started; `up` waits on health
        assert busy(bed, [victim])  # the fake engine runs there
        sshd = int((bed.dir / victim / "sshd.pid").read_text())
        assert "sshd" in Path(f"/proc/{sshd}/cmdline").read_text()
        os.kill(sshd, signal.SIGKILL)  # PID 1 of the host: the kernel takes the host down
        out, err = proc.communicate(timeout=180)
        text = out + err
        print(err)
        assert proc.returncode != 0, text
        assert "host p2" in text, text
        others = [h for n, h in UCM4_HOSTS.items() if n != "p2"]
        assert busy(bed, others) == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        r = subprocess.run(
            ["bash", str(TESTBED_SH), "up", str(TESTBED_HOSTS)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHON": sys.executable},
            timeout=300,
        )
        assert r.returncode == 0, f"repairing the bed failed:\n{r.stdout}\n{r.stderr}"


def test_down_from_the_state_file_after_kvpd_was_killed(
    bed: Testbed, fake_engine: Path, tmp_path: Path
) -> None:
    inv = inventory(tmp_path, bed, fake_engine, UCM4_HOSTS)
    state_dir = tmp_path / "state"
    state = killed_once_recorded(state_dir, inv, 4)
    assert state["status"] == "starting"
    hosts = list(UCM4_HOSTS.values())
    assert set(busy(bed, hosts)) == set(hosts)  # one fake engine per host, orphaned
    r = kvpd(state_dir, "down", PROFILE, "--json", "--grace", "5")  # a fresh kvpd process
    result = json.loads(r.stdout)
    assert {p["result"] for p in result["processes"]} == {"stopped"}, result
    assert busy(bed, hosts) == {}


def test_down_stops_a_start_the_killed_up_never_recorded(
    bed: Testbed, fake_engine: Path, tmp_path: Path
) -> None:
    """`up` SIGKILLed between starting a process and recording it (the window is a round trip
    wide; here it is widened by taking one process out of both records afterwards): `down`
    finds it by the deployment's environment and run dir on its host, and stops it too."""
    inv = inventory(tmp_path, bed, fake_engine, UCM4_HOSTS)
    state_dir = tmp_path / "state"
    state = killed_once_recorded(state_dir, inv, 4)
    lost = state["processes"][0]
    host = lost["host"]
    # fault injection: neither the local cache nor the host's record names `lost`
    path = state_dir / PROFILE / "state.json"
    state["processes"] = [p for p in state["processes"] if p["name"] != lost["name"]]
    path.write_text(json.dumps(state))
    t = SSHTransport(bed.spec(UCM4_HOSTS[host], name=host))
    try:
        record = state["run_dirs"][host] + "/" + RECORD_FILE
        assert t.run(["rm", "-f", "--", record]).ok
    finally:
        t.close()
    hosts = list(UCM4_HOSTS.values())
    assert set(busy(bed, hosts)) == set(hosts)
    st = kvpd(state_dir, "status", PROFILE, "--json", "--inventory", str(inv), "--rehearse",
              *SPREAD, check=False)  # fmt: skip
    seen = json.loads(st.stdout)
    assert lost["name"] not in {p["name"] for p in seen["processes"]}
    assert {"host": host, "pgid": lost["pgid"], "name": lost["name"]} in seen["unrecorded"]
    r = kvpd(state_dir, "down", PROFILE, "--json", "--grace", "5", "--inventory", str(inv),
             "--rehearse", *SPREAD)  # fmt: skip
    result = json.loads(r.stdout)
    outcomes = {p["name"]: p["result"] for p in result["processes"]}
    assert outcomes.get(f"{lost['name']} (unrecorded)") == "stopped", result
    assert busy(bed, hosts) == {}
