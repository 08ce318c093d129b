"""Seed topologies rehearsed at their real size on the SSH test bed with kvpd's stand-in engine
(`kvpd up --rehearse-with standin`): every DP rank a process of its own carrying the guide's
command line and environment, the real Mooncake master, kvpd's proxy spreading requests over
every prefiller and decoder, and `down` leaving nothing on any host.

The stand-in does no inference, so 12 engines fit 2 cores; KV proofs stay with the CPU vLLM
rehearsals (test_ssh_rehearsal.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_ssh_rehearsal import (
    SHARED,
    Rehearsal,
    assert_down_leaves_nothing,
    fetch,
    kvpd,
    metric,
    write_inventory,
)
from tests.testbed import Testbed

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

ENGINE_ROLES = ("prefill", "decode", "mixed")


# The rehearsals of this module share bed hosts and ports: one runs at a time, whatever the order.
_ACTIVE: list[Rehearsal] = []


def exclusive(rh: Rehearsal) -> Rehearsal:
    """`rh` running, every other rehearsal of this module stopped."""
    for other in _ACTIVE:
        if other is not rh:
            other.kvpd("down", other.name, check=False, timeout=300)
    return rh.ensure_up()


def rehearse_standin(
    tmp: Path, bed: Testbed, profile: str, hosts: dict[str, str]
) -> Iterator[Rehearsal]:
    """`kvpd up PROFILE --rehearse-with standin` on the bed hosts `hosts` (profile host -> hN);
    `down` afterwards whatever happened."""
    state_dir = tmp / "state"
    storage = SHARED / f"{profile}-standin"
    storage.mkdir(parents=True, exist_ok=True)
    inv = write_inventory(tmp / "inventory.yaml", bed, hosts, storage)
    for other in _ACTIVE:  # sharing hosts and ports: only one runs at a time
        other.kvpd("down", other.name, check=False, timeout=300)
    up_args = ["up", profile, "--rehearse-with", "standin", "--inventory", str(inv)]
    up_args += ["--yes", "--json"]
    r = kvpd(state_dir, *up_args, check=False, timeout=600)
    try:
        assert r.returncode == 0, f"kvpd up --rehearse-with standin failed:\n{r.stdout}\n{r.stderr}"
        plan = json.loads((state_dir / profile / "state.json").read_text())["plan"]
        rh = Rehearsal(profile, state_dir, hosts, bed, json.loads(r.stdout), plan, up_args)
        _ACTIVE.append(rh)
        yield rh
    finally:
        _ACTIVE[:] = [a for a in _ACTIVE if a.name != profile]
        kvpd(state_dir, "down", profile, check=False, timeout=300)
        shutil.rmtree(storage, ignore_errors=True)


def real_plan(rh: Rehearsal) -> dict[str, Any]:
    """The plan of the real deployment on the same inventory (no rehearsal)."""
    inv = rh.state_dir.parent / "inventory.yaml"
    r = kvpd(rh.state_dir, "plan", rh.name, "--inventory", str(inv), "--json")
    return json.loads(r.stdout)


def engines(rh: Rehearsal) -> list[dict[str, Any]]:
    return [p for p in rh.plan["processes"] if p["role"] in ENGINE_ROLES]


def host_view(rh: Rehearsal, process: str) -> tuple[list[str], dict[str, str]]:
    """The running process's command line and environment, read on its host over SSH."""
    from kvpd.exec.ssh import SSHTransport

    st = json.loads((rh.state_dir / rh.name / "state.json").read_text())
    rec = next(r for r in st["processes"] if r["name"] == process)
    t = SSHTransport(rh.bed.spec(rh.hosts[rec["host"]]))
    try:
        cmd = t.run(["cat", f"/proc/{rec['pid']}/cmdline"], timeout_s=30)
        env = t.run(["cat", f"/proc/{rec['pid']}/environ"], timeout_s=30)
    finally:
        t.close()
    assert cmd.ok, (cmd.stderr, env.stderr)
    assert env.ok, (cmd.stderr, env.stderr)
    argv = [a for a in cmd.stdout.split("\0") if a]
    environ = dict(kv.split("=", 1) for kv in env.stdout.split("\0") if "=" in kv)
    return argv, environ


def spread(rh: Rehearsal, requests: int) -> dict[str, float]:
    """Send `requests` completions through the proxy; requests served per engine."""
    before = {
        p["name"]: metric(rh.url(p["name"]), "vllm:request_success_total") for p in engines(rh)
    }
    for i in range(requests):
        prompt = " ".join(f"w{i}x{j}" for j in range(300))  # several blocks, all distinct
        status, body = fetch(
            rh.url("proxy") + "/v1/completions",
            {"model": rh.model, "prompt": prompt, "max_tokens": 4},
        )
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == 4
    return {n: metric(rh.url(n), "vllm:request_success_total") - v for n, v in before.items()}


def check_carries_the_guide(rh: Rehearsal) -> None:
    """Every engine process on its host runs with the real command line and environment."""
    real = {p["name"]: p for p in real_plan(rh)["processes"]}
    for p in engines(rh):
        argv, environ = host_view(rh, p["name"])
        want = real[p["name"]]
        assert argv[argv.index("--") + 1 :] == want["command"], p["name"]
        for k, v in want["env"]:
            if "$" in v:  # expanded by the launch script on the host, as on the real one
                assert v.split("$")[0] in environ.get(k, ""), (p["name"], k)
            else:
                assert environ.get(k) == v, (p["name"], k)


# -- large-ep: 4 prefill DP ranks and 8 decode DP ranks on 8 hosts -------------------------------

LARGE_EP_HOSTS = {f"p{i}": f"h{i}" for i in range(1, 5)} | {
    f"d{i}": f"h{i + 4}" for i in range(1, 5)
}


@pytest.fixture
def large_ep(_large_ep: Rehearsal) -> Rehearsal:
    return exclusive(_large_ep)  # up again if the `down` test ran before


@pytest.fixture(scope="module")
def _large_ep(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    if len(bed.names) < 8:
        pytest.skip("large-ep needs 8 bed hosts")
    yield from rehearse_standin(
        tmp_path_factory.mktemp("large-ep"), bed, "large-ep", LARGE_EP_HOSTS
    )


def test_large_ep_every_rank_runs_with_the_guide_settings(large_ep: Rehearsal) -> None:
    up = {p["name"]: p for p in large_ep.up["processes"]}
    assert all(p["status"] == "healthy" for p in up.values()), up
    eng = engines(large_ep)
    assert len([p for p in eng if p["role"] == "prefill"]) == 4
    assert len([p for p in eng if p["role"] == "decode"]) == 8
    assert {p["host"] for p in eng} == set(LARGE_EP_HOSTS)
    ranks = sorted(p["command"][p["command"].index("--data-parallel-rank") + 1] for p in eng)
    assert ranks == sorted([str(r) for r in range(4)] + [str(r) for r in range(8)])
    assert all("stand-in" in p["substituted"] for p in eng)
    check_carries_the_guide(large_ep)


def test_large_ep_proxy_spreads_over_every_engine(large_ep: Rehearsal) -> None:
    served = spread(large_ep, 32)
    assert all(v >= 1 for v in served.values()), served


def test_large_ep_status_sees_every_port(large_ep: Rehearsal) -> None:
    rows = json.loads(large_ep.kvpd("status", large_ep.name, "--json").stdout)["processes"]
    bad = [r for r in rows if not (r["alive"] and r["healthy"] and r["listening"] == r["ports"])]
    assert not bad, bad


def test_large_ep_down_leaves_nothing(large_ep: Rehearsal) -> None:
    assert_down_leaves_nothing(large_ep)


# -- ucm-mooncake-2p2d at full size: 2 prefill and 2 decode instances on 2 hosts ----------------


@pytest.fixture
def mooncake_full(_mooncake_full: Rehearsal) -> Rehearsal:
    return exclusive(_mooncake_full)


@pytest.fixture(scope="module")
def _mooncake_full(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    yield from rehearse_standin(
        tmp_path_factory.mktemp("mooncake-full"), bed, "ucm-mooncake-2p2d", {"p1": "h1", "d1": "h2"}
    )


def test_mooncake_full_size_spreads_and_hands_over(mooncake_full: Rehearsal) -> None:
    eng = engines(mooncake_full)
    assert sorted(p["name"] for p in eng) == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    check_carries_the_guide(mooncake_full)
    served = spread(mooncake_full, 8)
    assert all(v >= 1 for v in served.values()), served
    received = sum(
        metric(
            mooncake_full.url(p["name"]),
            "vllm:prompt_tokens_by_source_total",
            source="external_kv_transfer",
        )
        for p in eng
        if p["role"] == "decode"
    )
    assert received > 0  # decode took the prefill's kv_transfer_params


def test_mooncake_full_size_bench_through_the_proxy(
    mooncake_full: Rehearsal, tmp_path: Path
) -> None:
    """`kvpd bench --protocol twice` against the running rehearsal: the P/D proof holds (decode
    served every request and received KV), and the warm run hits the engines' prefix caches."""
    run = mooncake_full.bench_twice(
        tmp_path / "bench", 8, input_len=1024, output_len=8, timeout=600
    )
    cold, warm = run["records"]
    assert (cold["phase"], warm["phase"]) == ("cold", "warm")
    for rec in (cold, warm):
        assert rec["result"]["completed"] == 8
        assert rec["result"]["failed"] == 0
        assert rec["metrics"]["summary"]["decode_kv_received_tokens"] > 0
    # the proxy may route a prompt to another prefiller the second time; decode caches it too
    hits = sum(t.get("prefix_cache_hits", 0) for t in warm["metrics"]["per_target"].values())
    assert hits > 0, warm["metrics"]["per_target"]
    # the output check ran in the canary and after each phase: the stand-in's tokens depend
    # only on the prompt, so every P/D pair returns what prefill-0 returns alone
    assert mooncake_full.up["canary"]["outputs"]["ok"], mooncake_full.up["canary"]
    for rec in (cold, warm):
        assert rec["outputs"]["summary"] == "outputs: 4/4 identical (first 16 tokens)", rec


def test_mooncake_full_size_down_leaves_nothing(mooncake_full: Rehearsal) -> None:
    assert_down_leaves_nothing(mooncake_full)
