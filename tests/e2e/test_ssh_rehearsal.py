"""Seed profiles rehearsed across the SSH test bed: `kvpd up --rehearse` with CPU vLLM engines,
the real memcache MetaService and Mooncake master, a request through the proxy, `status` and
`logs` reaching remote hosts, and `down` leaving no process on any host.

Each rehearsal is brought up once (module fixture) and every check runs against it; the last
test of each group runs `kvpd down`. Every kvpd call is a fresh process, so `down`, `status` and
`logs` work from the state file alone.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from tests.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / ".venv-engine" / "bin" / "vllm"
SERVICES_PY = REPO / ".venv-services" / "bin" / "python"
MOONCAKE = REPO / ".venv-services" / "bin" / "mooncake_master"
MODEL = REPO / ".kvpd" / "models" / "tiny"
# Below the repo, which every bed host shares: the KV hand-over folder of the rehearsals.
SHARED = REPO / ".kvpd" / "e2e-ssh"
# A prompt of several whole 32-token blocks, so ExampleConnector hands KV over.
PROMPT = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 10)


# -- helpers shared with test_ssh_faults.py ------------------------------------------------------


def write_inventory(
    path: Path,
    bed: Testbed,
    hosts: dict[str, str],
    storage: Path,
    *,
    known_hosts: str | None = None,
    devices: int | None = None,
    rehearsal: dict[str, Any] | None = None,
) -> Path:
    """An inventory placing profile host NAME on bed host hN (`hosts` = {NAME: hN})."""

    def host(h: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"address": bed.addresses[h]}
        if devices is not None:
            entry["devices"] = devices
        return entry

    data = {
        "hosts": {name: host(h) for name, h in hosts.items()},
        "ssh": {"user": "root", "key": bed.key, "known_hosts": known_hosts or bed.known_hosts},
        "rehearsal": {
            "model": str(MODEL),
            "vllm": str(VLLM),
            "python": str(SERVICES_PY),
            "mooncake_master": str(MOONCAKE),
            "storage": str(storage),
            **(rehearsal or {}),
        },
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def kvpd_env(state_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["KVPD_STATE_DIR"] = str(state_dir)
    env.update(extra or {})
    return env


def kvpd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvpd.cli.main", *args]


def kvpd(
    state_dir: Path,
    *args: str,
    check: bool = True,
    timeout: float = 900,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the kvpd CLI in a fresh process with its own state directory (and `env` on top)."""
    r = subprocess.run(
        kvpd_cmd(*args),
        cwd=state_dir.parent,
        env=kvpd_env(state_dir, env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and r.returncode != 0:
        raise AssertionError(
            f"kvpd {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        )
    return r


def processes_on(bed: Testbed, hosts: list[str]) -> dict[str, list[str]]:
    """What runs on each bed host besides sshd (PID 1 and sessions), over SSH: `pid args`."""
    from kvpd.exec.ssh import SSHTransport

    out: dict[str, list[str]] = {}
    for h in hosts:
        t = SSHTransport(bed.spec(h))
        try:
            r = t.run(["ps", "-eo", "pid=,args="], timeout_s=30)
        finally:
            t.close()
        assert r.ok, r.stderr
        rows = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
        # `ps` replaced the login shell (exec), so it is the only non-sshd part of our session.
        out[h] = [ln for ln in rows if not ln.split(None, 1)[-1].startswith(("sshd", "ps -eo"))]
    return out


def fetch(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> tuple[int, Any]:
    """GET (or POST `body` as JSON) with http.client: urllib's `Connection: close` makes the
    MetaService's HTTP server drop the body."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        conn.request("POST" if data else "GET", u.path or "/", body=data, headers=headers)
        resp = conn.getresponse()
        raw, status = resp.read(), resp.status
    finally:
        conn.close()
    try:
        return status, json.loads(raw or b"{}")
    except ValueError:
        return status, raw.decode(errors="replace")


def metric(base: str, name: str, **labels: str) -> float:
    status, text = fetch(base + "/metrics", timeout=30)
    assert status == 200, text
    assert isinstance(text, str), text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
    return total


# -- a rehearsal brought up once per group -------------------------------------------------------


@dataclass
class Rehearsal:
    name: str  # deployment (= profile) name
    state_dir: Path
    hosts: dict[str, str]  # profile host -> bed host
    bed: Testbed
    up: dict[str, Any]  # `kvpd up --json`
    plan: dict[str, Any]
    up_args: list[str]  # how it was started (to start it again)

    def kvpd(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return kvpd(self.state_dir, *args, **kw)

    def bench_twice(
        self, results: Path, prompts: int, input_len: int, output_len: int, timeout: float
    ) -> dict[str, Any]:
        """`kvpd bench --protocol twice` against the running rehearsal: its JSON, once it
        exited 0 and said ok."""
        r = self.kvpd(
            "bench", self.name, "--protocol", "twice", "--num-prompts", str(prompts),
            "--input-len", str(input_len), "--output-len", str(output_len),
            "--tokenizer", str(MODEL), "--results", str(results), "--json", "--no-charts",
            check=False, timeout=timeout,
        )  # fmt: skip
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
        run: dict[str, Any] = json.loads(r.stdout)
        assert run["ok"], run
        return run

    def ensure_up(self) -> Rehearsal:
        """Start it again if a test (the `down` one) stopped it: every test gets a running
        deployment whatever ran before it."""
        st = self.kvpd("status", self.name, "--json", check=False)
        procs = json.loads(st.stdout).get("processes", []) if st.returncode == 0 else []
        if procs and all(p["alive"] for p in procs):
            return self
        r = self.kvpd(*self.up_args, check=False)
        assert r.returncode == 0, f"kvpd up again failed:\n{r.stdout}\n{r.stderr}"
        self.up = json.loads(r.stdout)
        return self

    def url(self, process: str) -> str:
        """http://address:port of a process of the plan (its first port)."""
        p = next(p for p in self.plan["processes"] if p["name"] == process)
        addr = next(h["address"] for h in self.plan["hosts"] if h["name"] == p["host"])
        return f"http://{addr}:{p['ports'][0]}"

    def health(self, process: str) -> str:
        return next(p for p in self.plan["processes"] if p["name"] == process)["health"]["url"]

    @property
    def model(self) -> str:
        return self.plan["served_model"]

    def leftovers(self) -> dict[str, list[str]]:
        return {h: ps for h, ps in processes_on(self.bed, list(self.hosts.values())).items() if ps}


def rehearse(
    tmp: Path,
    bed: Testbed,
    profile: str,
    hosts: dict[str, str],
    sets: list[str],
    *,
    devices: int | None = None,
    engines: Literal["vllm", "standin"] = "vllm",
) -> Iterator[Rehearsal]:
    """`kvpd up PROFILE --rehearse` on the bed hosts `hosts` (profile host -> hN), with CPU vLLM
    engines or (`engines="standin"`) kvpd's stand-in engines; `down` afterwards whatever
    happened."""
    state_dir = tmp / "state"
    storage = SHARED / profile / "kv"
    shutil.rmtree(storage, ignore_errors=True)
    storage.mkdir(parents=True)
    inv = write_inventory(tmp / "inventory.yaml", bed, hosts, storage, devices=devices)
    set_args = [a for s in sets for a in ("--set", s)]
    mode = ["--rehearse"] if engines == "vllm" else ["--rehearse-with", engines]
    up_args = ["up", profile, *mode, "--inventory", str(inv), *set_args, "--yes", "--json"]
    r = kvpd(state_dir, *up_args, check=False)
    try:
        assert r.returncode == 0, f"kvpd up --rehearse {profile} failed:\n{r.stdout}\n{r.stderr}"
        up = json.loads(r.stdout)
        plan = json.loads((state_dir / profile / "state.json").read_text())["plan"]
        yield Rehearsal(profile, state_dir, hosts, bed, up, plan, up_args)
    finally:
        kvpd(state_dir, "down", profile, check=False, timeout=300)
        shutil.rmtree(SHARED / profile, ignore_errors=True)


def assert_down_leaves_nothing(rh: Rehearsal) -> None:
    r = rh.kvpd("down", rh.name, "--json", check=False, timeout=300)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    result = json.loads(r.stdout)
    assert result["clean"], result
    assert {p["result"] for p in result["processes"]} <= {"stopped", "killed"}, result
    assert rh.leftovers() == {}
    st = rh.kvpd("status", rh.name, "--json")
    assert not any(p["alive"] for p in json.loads(st.stdout)["processes"])


def complete(rh: Rehearsal, prompt: str = PROMPT, max_tokens: int = 6) -> dict[str, Any]:
    status, body = fetch(
        rh.url("proxy") + "/v1/completions",
        {"model": rh.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == max_tokens
    return body


# ucm-centralized-2p2d's four instances, one per host (test_ssh_day2 and test_ssh_faults place
# it so; its CPU-vLLM rehearsal runs through the bastion, test_ssh_bastion).
UCM4_HOSTS = {"p1": "h1", "d1": "h2", "p2": "h3", "d2": "h4"}


# -- layerwise/sparse 1P1D across 2 hosts (real MetaService) ----------------------------------


@pytest.fixture
def layerwise(_layerwise: Rehearsal) -> Rehearsal:
    return _layerwise.ensure_up()


@pytest.fixture(scope="module")
def _layerwise(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    yield from rehearse(
        tmp_path_factory.mktemp("layerwise"),
        bed,
        "layerwise-sparse-1p1d",
        {"p1": "h1", "d1": "h2"},
        # The bed's services venv has memcache-hybrid 1.3: its metrics_url and HTTP /health
        # (the guide's 1.2 configuration is ready by its port; unit-tested on the fake).
        ['kv.memcache.version="1.3"'],
    )


def test_layerwise_metaservice_runs_for_real(layerwise: Rehearsal) -> None:
    status, body = fetch(layerwise.health("metaservice"))
    assert status == 200, body
    assert body.get("status") == "ok", body
    r = layerwise.kvpd("logs", "metaservice", "-n", "400")
    assert "memcache" in r.stdout.lower() or "mmc" in r.stdout.lower()
    # MetaService's flock lives in /tmp, private per host: present on p1 only.
    from kvpd.exec.ssh import SSHTransport

    for h, expect in (("h1", True), ("h2", False)):
        t = SSHTransport(layerwise.bed.spec(h))
        try:
            assert t.run(["test", "-e", "/tmp/mmc_meta_service.lock"]).ok is expect, h
        finally:
            t.close()


def test_layerwise_engines_up_and_request_through_proxy(layerwise: Rehearsal) -> None:
    stages = {p["name"]: p["stage"] for p in layerwise.up["processes"]}
    assert stages["metaservice"] < stages["prefill-0"] < stages["decode-0"] < stages["proxy"]
    before = metric(
        layerwise.url("decode-0"),
        "vllm:prompt_tokens_by_source_total",
        source="external_kv_transfer",
    )
    complete(layerwise)
    after = metric(
        layerwise.url("decode-0"),
        "vllm:prompt_tokens_by_source_total",
        source="external_kv_transfer",
    )
    assert after - before >= 32


def test_layerwise_bundle_on_both_hosts_and_decode_selects_kvpds_planner(
    layerwise: Rehearsal,
) -> None:
    """`up` put kvpd's node bundle on both hosts (the proxy on p1; on d1 the decode, whose
    sparse offload uses kvpd's planner), and the running decode's environment selects it."""
    st = json.loads(layerwise.kvpd("status", layerwise.name, "--json").stdout)
    assert {b["host"] for b in st["bundle"]} == {"p1", "d1"}, st["bundle"]
    assert all(b["action"] in ("installed", "kept") for b in st["bundle"]), st["bundle"]
    dec = next(p for p in st["processes"] if p["name"] == "decode-0")
    from kvpd.exec.ssh import SSHTransport

    t = SSHTransport(layerwise.bed.spec(layerwise.hosts["d1"]))
    try:
        r = t.run(["cat", f"/proc/{dec['pid']}/environ"])
    finally:
        t.close()
    assert r.ok, r.stderr
    env = dict(v.split("=", 1) for v in r.stdout.split("\0") if "=" in v)
    assert env.get("KVPD_SPARSE_PLANNER") == "kvpd"
    assert "bundle/engine" in env.get("PYTHONPATH", "")


def test_layerwise_down_stops_everything(layerwise: Rehearsal) -> None:
    assert_down_leaves_nothing(layerwise)


# -- UCM + Mooncake P2P, shrunk to 1P1D across 2 hosts (real Mooncake master) -----------------


@pytest.fixture
def mooncake(_mooncake: Rehearsal) -> Rehearsal:
    return _mooncake.ensure_up()


@pytest.fixture(scope="module")
def _mooncake(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    yield from rehearse(
        tmp_path_factory.mktemp("mooncake"),
        bed,
        "ucm-mooncake-2p2d",
        {"p1": "h3", "d1": "h4"},
        ["prefill.instances=1", "decode.instances=1"],
    )


def test_mooncake_master_healthy_and_request_through_proxy(mooncake: Rehearsal) -> None:
    status, body = fetch(mooncake.health("mooncake-master"))
    assert status == 200, body
    assert body.get("status") == "ok", body
    complete(mooncake)


def test_mooncake_down_stops_everything(mooncake: Rehearsal) -> None:
    assert_down_leaves_nothing(mooncake)
