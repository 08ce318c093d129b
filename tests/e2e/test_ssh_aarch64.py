"""An aarch64 host on the SSH test bed: its Python is an arm64 CPython run under qemu.

The stand-in rehearsal of ucm-mooncake-2p2d with the proxy's Python on its host set to the
emulated arm64 interpreter of scripts/install-aarch64.sh. That slot reports the platform
`cpython-311-aarch64-linux-gnu`; `kvpd up` cross-builds its wheel on the controller (no host
build, no wheel of another host), installs it with that Python's own pip over SSH, verifies it
there (the native core loads, NEON row planner), and the proxy then serves requests from that
bundle, emulated. `kvpd status` shows the NEON planner; `down` leaves nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import pytest

from kvpd.exec import cross_build
from tests.e2e.conftest import Testbed
from tests.e2e.test_ssh_rehearsal import (
    SHARED,
    Rehearsal,
    assert_down_leaves_nothing,
    fetch,
    kvpd,
    write_inventory,
)

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

PROFILE = "ucm-mooncake-2p2d"
HOSTS = {"p1": "h1", "d1": "h2"}
EMULATED = cross_build.default_sysroot() / "bin" / "python3.11"


def _unavailable() -> str | None:
    chain = cross_build.find_toolchain("aarch64")
    if isinstance(chain, str):
        return chain
    if not EMULATED.exists() or shutil.which("qemu-aarch64-static") is None:
        return f"{EMULATED} or qemu-aarch64-static is missing (bash scripts/install-aarch64.sh)"
    return None


@pytest.fixture(scope="module")
def arm_proxy(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    why = _unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the aarch64 bed test: {why}")
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("aarch64")
    state_dir = tmp / "state"
    storage = SHARED / f"{PROFILE}-aarch64"
    storage.mkdir(parents=True, exist_ok=True)
    inv = write_inventory(tmp / "inventory.yaml", bed, HOSTS, storage)
    up_args = ["up", PROFILE, "--rehearse-with", "standin", "--inventory", str(inv)]
    up_args += ["--set", f"proxy.python={EMULATED}", "--yes", "--json"]
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


def _bundle(rh: Rehearsal) -> list[dict[str, object]]:
    state = json.loads((rh.state_dir / rh.name / "state.json").read_text())
    return list(state["bundle"])


def test_the_aarch64_slot_gets_the_cross_built_wheel(arm_proxy: Rehearsal) -> None:
    proxy = next(b for b in _bundle(arm_proxy) if b["slot"] == "proxy")
    assert proxy["platform"] == "cpython-311-aarch64-linux-gnu", proxy
    assert (proxy["action"], proxy["source"]) == ("installed", "cross"), proxy
    native = proxy["native"]
    assert isinstance(native, dict)
    assert native["implementation"] == "native" and native["ascend_planner"] == "neon", native


def test_the_emulated_proxy_serves_and_status_shows_neon(arm_proxy: Rehearsal) -> None:
    prompt = " ".join(f"arm{j}" for j in range(200))
    status, body = fetch(
        arm_proxy.url("proxy") + "/v1/completions",
        {"model": arm_proxy.model, "prompt": prompt, "max_tokens": 4},
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4
    st = arm_proxy.kvpd("status", PROFILE)
    assert "planner neon" in st.stdout, st.stdout


def test_down_leaves_nothing(arm_proxy: Rehearsal) -> None:
    assert_down_leaves_nothing(arm_proxy)
