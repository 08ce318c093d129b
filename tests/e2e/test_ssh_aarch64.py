"""aarch64 hosts on the SSH test bed: their Pythons are an arm64 CPython run under qemu.

A stand-in rehearsal of layerwise-sparse-1p1d (the profile whose decode runs sparse KV offload)
with two slots on the emulated arm64 interpreter of scripts/install-aarch64.sh: the decode's
engine Python on d1 (`rehearsal.standin_python`) and the proxy's on p1 (`proxy.python`). Both
report the platform `cpython-311-aarch64-linux-gnu`; `kvpd up` cross-builds their wheel on the
controller (no host build, no wheel of another host), installs it with that Python's own pip over
SSH and verifies it there (native core, NEON row planner). The decode process then runs under
qemu, imports kvpd's native planner from its node bundle (the plan says `KVPD_SPARSE_PLANNER=kvpd`;
it would not start without it) and plans every request the proxy sends it, one call per
generated token: checked from that process's own /metrics and log, not from the bundle check.
`kvpd status` shows the NEON planner for both slots, and for the decode what its own log says
it loaded; `down` leaves nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import pytest

from kvpd.exec import cross_build
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

PROFILE = "layerwise-sparse-1p1d"
HOSTS = {"p1": "h1", "d1": "h2"}
EMULATED = cross_build.default_sysroot() / "bin" / "python3.11"
ARM = "cpython-311-aarch64-linux-gnu"
PLANNED = "kvpd:sparse_planner_"


def _unavailable() -> str | None:
    chain = cross_build.find_toolchain("aarch64")
    if isinstance(chain, str):
        return chain
    if not EMULATED.exists() or shutil.which("qemu-aarch64-static") is None:
        return f"{EMULATED} or qemu-aarch64-static is missing (bash scripts/install-aarch64.sh)"
    return None


@pytest.fixture(scope="module")
def arm(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    why = _unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the aarch64 bed test: {why}")
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("aarch64")
    state_dir = tmp / "state"
    storage = SHARED / f"{PROFILE}-aarch64"
    storage.mkdir(parents=True, exist_ok=True)
    inv = write_inventory(
        tmp / "inventory.yaml", bed, HOSTS, storage,
        rehearsal={"standin_python": {"d1": str(EMULATED)}},
    )  # fmt: skip
    up_args = ["up", PROFILE, "--rehearse-with", "standin", "--inventory", str(inv)]
    # The bed's services venv has memcache-hybrid 1.3 (the MetaService runs for real, on x86).
    up_args += ["--set", 'kv.memcache.version="1.3"', "--set", f"proxy.python={EMULATED}"]
    up_args += ["--yes", "--json"]
    # An empty wheel cache: the aarch64 wheel must be built by this `up`.
    env = {"KVPD_CACHE_DIR": str(tmp / "wheel-cache")}
    r = kvpd(state_dir, *up_args, check=False, timeout=900, env=env)
    try:
        assert r.returncode == 0, f"kvpd up failed:\n{r.stdout}\n{r.stderr}"
        plan = json.loads((state_dir / PROFILE / "state.json").read_text())["plan"]
        yield Rehearsal(PROFILE, state_dir, HOSTS, bed, json.loads(r.stdout), plan, up_args)
    finally:
        kvpd(state_dir, "down", PROFILE, check=False, timeout=300)
        shutil.rmtree(storage, ignore_errors=True)


def _bundle(rh: Rehearsal) -> dict[tuple[str, str], dict[str, object]]:
    state = json.loads((rh.state_dir / rh.name / "state.json").read_text())
    return {(b["host"], b["slot"]): b for b in state["bundle"]}


def _planner_rows(rh: Rehearsal) -> list[str]:
    status, text = fetch(rh.url("decode-0") + "/metrics", timeout=60)
    assert status == 200, text
    assert isinstance(text, str), text
    return [ln for ln in text.splitlines() if ln.startswith(PLANNED)]


def test_both_aarch64_slots_get_the_cross_built_wheel(arm: Rehearsal) -> None:
    slots = _bundle(arm)
    for key in (("d1", "engine"), ("p1", "proxy")):
        b = slots[key]
        assert b["platform"] == ARM, b
        assert (b["action"], b["source"]) == ("installed", "cross"), b
        native = b["native"]
        assert isinstance(native, dict)
        assert native["implementation"] == "native", b
        assert native["ascend_planner"] == "neon", b
    assert slots[("d1", "engine")]["python"] == str(EMULATED)
    assert slots[("d1", "engine")]["digest"] == slots[("p1", "proxy")]["digest"]  # one wheel


def test_the_emulated_decode_loaded_the_neon_planner_from_its_bundle(arm: Rehearsal) -> None:
    decode = next(p for p in arm.plan["processes"] if p["name"] == "decode-0")
    assert decode["command"][0] == str(EMULATED)
    assert dict(map(tuple, decode["env"]))["KVPD_SPARSE_PLANNER"] == "kvpd"
    info = next(r for r in _planner_rows(arm) if r.startswith(PLANNED + "info{"))
    assert 'planner="kvpd",isa="neon",machine="aarch64"' in info, info
    assert "/bundle/" in info, info
    assert f"_ascend_planner.{ARM}.so" in info, info
    log = arm.kvpd("logs", "decode-0", "-n", "400").stdout
    assert "sparse KV offload planner: kvpd's native core (neon row planner, aarch64)" in log


def test_the_emulated_decode_plans_every_request_the_proxy_sends(arm: Rehearsal) -> None:
    base, out = arm.url("decode-0"), 3

    def counts() -> dict[str, float]:
        names = ("requests", "steps", "loaded_tokens", "copy_descriptors")
        got = {n: metric(base, f"{PLANNED}{n}_total") for n in names}
        got["prompt"] = metric(base, "vllm:prompt_tokens_total")
        return got

    before = counts()  # `up`'s canary went through this decode too
    prompts = [" ".join(f"arm{i}-{j}" for j in range(40 + 20 * i)) for i in range(2)]
    for prompt in prompts:
        status, body = fetch(
            arm.url("proxy") + "/v1/completions",
            {"model": arm.model, "prompt": prompt, "max_tokens": out},
            timeout=300,
        )
        assert status == 200, body
        assert body["usage"]["completion_tokens"] == out
    d = {k: v - before[k] for k, v in counts().items()}
    assert d["requests"] == len(prompts), d
    assert d["steps"] == len(prompts) * out, d
    # index_topk 2048 exceeds these contexts: the first step of a request loads its whole
    # prompt, each later step the newest token; each load is one K and one V descriptor.
    assert d["loaded_tokens"] == d["prompt"] + len(prompts) * (out - 1), d
    assert d["copy_descriptors"] == 2 * d["loaded_tokens"], d


def test_status_shows_the_neon_planner_for_both_slots(arm: Rehearsal) -> None:
    st = json.loads(arm.kvpd("status", PROFILE, "--json").stdout)
    rows = {(b["host"], b["slot"]): b for b in st["bundle"]}
    for key in (("d1", "engine"), ("p1", "proxy")):
        assert rows[key]["native"]["ascend_planner"] == "neon", rows[key]
    assert all(p["alive"] and p["healthy"] for p in st["processes"]), st["processes"]
    # The decode's own word, from its log on d1: the planner it loaded, with the NEON path.
    decode = next(p for p in st["processes"] if p["name"] == "decode-0")
    said = {"planner": "kvpd", "isa": "neon"}
    assert decode["planner"] == {"planned": "kvpd", "reported": said}, decode
    text = arm.kvpd("status", PROFILE).stdout
    assert "planner neon" in text
    assert "kvpd neon" in text


def test_down_leaves_nothing(arm: Rehearsal) -> None:
    assert_down_leaves_nothing(arm)
