"""The node bundle on the SSH test bed: kvpd reaches a host only through `kvpd up`.

A real (not rehearsed) CPU deployment with kvpd's store connector across three bed hosts: prefill
on h1, decode on h2, the kvpd proxy on h3 running with ANOTHER Python version than the engines
(and the controller), so h3 needs a wheel of its own, built on h3. Checked: before `up`, no engine
Python on a host can import kvpd (the bed shares the repository and the Pythons, so this is what
keeps it from masking a missing bundle); after `up`, the engines load `KvpdStoreConnector` and the
proxy runs from the bundle; a second `up` installs nothing; `down --purge` removes the run dirs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_ssh_rehearsal import PROMPT, REPO, fetch, metric
from tests.e2e.test_ssh_rehearsal import kvpd as kvpd_cli
from tests.testbed import Testbed, other_python

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

ENGINE_PY = REPO / ".venv-engine" / "bin" / "python"
VLLM = REPO / ".venv-engine" / "bin" / "vllm"
MODEL = REPO / ".kvpd" / "models" / "tiny"
STORE = REPO / ".kvpd" / "e2e-ssh" / "bundle-kv"  # below the repo: shared by every bed host
NAME = "e2e-bundle"
HOSTS = {"p1": "h1", "d1": "h2", "px": "h3"}
RUN_DIR = f".kvpd/{NAME}/run"  # relative: below each host's private /root


def profile(bed: Testbed, proxy_python: str) -> dict[str, Any]:
    env = {
        "PYTHONHASHSEED": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": "${HOME}/.cache/kvpd/vllm",
        "TORCHINDUCTOR_CACHE_DIR": "${HOME}/.cache/kvpd/inductor",
        "XDG_CACHE_HOME": "cache/xdg",
    }
    return {
        "name": NAME,
        "hardware": "cpu",
        "hosts": {n: {"address": bed.addresses[h], "devices": 1} for n, h in HOSTS.items()},
        "ssh": {"user": "root", "key": bed.key, "known_hosts": bed.known_hosts},
        "model": {
            "path": str(MODEL),
            "served_name": "tiny",
            "attention": "gqa",
            "layers": 2,
            "kv_heads": 2,
            "head_dim": 32,
            "dtype": "bfloat16",
            "block_size": 32,
            "max_model_len": 512,
        },
        "env": env,
        "runtime": {
            "vllm": str(VLLM),
            "run_dir": RUN_DIR,
            "dirs": ["cache"],
            "health_timeout_s": 400,
        },
        "kv": {"kvpd_store": {"path": str(STORE), "dram_cache_gb": 0.25, "io_threads": 2}},
        "engine": {
            "enforce_eager": True,
            "kv_cache_memory_bytes": "16M",
            "max_num_seqs": 8,
            "max_num_batched_tokens": 4096,
            "enable_chunked_prefill": False,
            "block_size": 32,
            "args": ["--enable-prompt-tokens-details"],
        },
        "prefill": {"hosts": ["p1"], "port": 18100, "kv_connectors": ["kvpd_store"]},
        "decode": {"hosts": ["d1"], "port": 18200, "kv_connectors": ["kvpd_store"]},
        "proxy": {"host": "px", "port": 18000, "python": proxy_python},
    }


def kvpd(state_dir: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """The CLI with a wheel cache of this module's own, empty at the start: whatever an earlier
    run left in `~/.cache/kvpd` must not turn the proxy host's build into a cache hit."""
    cache = state_dir.parent / "wheel-cache"
    return kvpd_cli(state_dir, *args, env={"KVPD_CACHE_DIR": str(cache)}, **kw)


def on_host(bed: Testbed, host: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    from kvpd.exec.ssh import SSHTransport

    t = SSHTransport(bed.spec(host))
    try:
        r = t.run(argv, timeout_s=60)
    finally:
        t.close()
    return subprocess.CompletedProcess(argv, r.exit_code, r.stdout, r.stderr)


def importable(bed: Testbed, host: str, python: str) -> bool:
    return on_host(bed, host, [python, "-c", "import kvpd"]).returncode == 0


@dataclass
class Deployed:
    bed: Testbed
    state_dir: Path
    profile: Path
    proxy_python: str
    before: dict[str, bool]  # "host python" -> could import kvpd before up
    up_s: float

    def state(self) -> dict[str, Any]:
        return json.loads((self.state_dir / NAME / "state.json").read_text())

    def bundle(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(b["host"], b["slot"]): b for b in self.state()["bundle"]}


@pytest.fixture(scope="module")
def deployed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    other = other_python()
    if other is None:
        pytest.skip("no second Python (>= 3.10, another version) for the proxy host")
    bed: Testbed = request.getfixturevalue("bed")  # root, engine, model (or a skip)
    tmp = tmp_path_factory.mktemp("bundle")
    prof = tmp / f"{NAME}.yaml"
    prof.write_text(yaml.safe_dump(profile(bed, other), sort_keys=False))
    shutil.rmtree(STORE, ignore_errors=True)
    STORE.mkdir(parents=True)
    state_dir = tmp / "state"
    # A clean slate on the hosts: no bundle from an earlier session.
    for h in HOSTS.values():
        on_host(bed, h, ["rm", "-rf", "--", RUN_DIR])
    before = {
        f"{h} {py}": importable(bed, h, py)
        for h, py in (("h1", str(ENGINE_PY)), ("h2", str(ENGINE_PY)), ("h3", other))
    }
    import time

    t0 = time.monotonic()
    r = kvpd(state_dir, "up", str(prof), "--yes", "--json", check=False)
    up_s = time.monotonic() - t0
    try:
        assert r.returncode == 0, f"kvpd up failed:\n{r.stdout}\n{r.stderr}"
        yield Deployed(bed, state_dir, prof, other, before, up_s)
    finally:
        kvpd(state_dir, "down", str(prof), "--purge", check=False, timeout=300)
        shutil.rmtree(STORE.parent, ignore_errors=True)


def test_before_up_no_engine_python_on_a_host_imports_kvpd(deployed: Deployed) -> None:
    masked = [k for k, v in deployed.before.items() if v]
    assert deployed.before, (
        f"kvpd is importable before `up` by: {masked}. The bed would hide a missing bundle; an "
        "engine venv from an older install-engine.sh has kvpd installed: run `make engine`."
    )
    assert not masked, (
        f"kvpd is importable before `up` by: {masked}. The bed would hide a missing bundle; an "
        "engine venv from an older install-engine.sh has kvpd installed: run `make engine`."
    )


def test_each_host_got_the_bundle_for_its_platform(deployed: Deployed) -> None:
    b = deployed.bundle()
    assert set(b) == {("p1", "engine"), ("d1", "engine"), ("px", "proxy")}
    for key in (("p1", "engine"), ("d1", "engine")):
        assert b[key]["action"] == "installed", b[key]
        assert b[key]["source"] == "local", b[key]
        exe = Path(b[key]["executable"])  # the engine venv may be reached through a link
        assert (exe.parent.resolve(), exe.name) == (ENGINE_PY.parent.resolve(), ENGINE_PY.name)
        assert b[key]["implementation"] == "native"
    # Both engines run the one wheel the controller built; the proxy's Python has another ABI.
    assert b[("p1", "engine")]["digest"] == b[("d1", "engine")]["digest"]
    px = b[("px", "proxy")]
    assert px["action"] == "installed", px
    assert px["source"] == "host:px", px
    assert px["platform"] != b[("p1", "engine")]["platform"]
    assert px["digest"] != b[("p1", "engine")]["digest"]
    assert px["executable"] == deployed.proxy_python
    # the extension is loaded by itself: the proxy's bare Python needs no NumPy for this
    assert px["implementation"] in ("native", "numpy")


def test_engines_load_the_store_connector_from_the_bundle(deployed: Deployed) -> None:
    st = deployed.state()
    for name, host in (("prefill-0", "h1"), ("decode-0", "h2")):
        rec = next(p for p in st["processes"] if p["name"] == name)
        log = on_host(deployed.bed, host, ["cat", rec["log"]]).stdout
        assert "KvpdStoreConnector" in log, log[-2000:]
        environ = on_host(deployed.bed, host, ["cat", f"/proc/{rec['pid']}/environ"]).stdout
        paths = [e for e in environ.split("\0") if e.startswith("PYTHONPATH=")]
        run_dir = st["run_dirs"][rec["host"]]
        assert paths == [f"PYTHONPATH={run_dir}/bundle/engine"], paths
    decode = f"http://{deployed.bed.addresses['h2']}:18200"
    src = "vllm:prompt_tokens_by_source_total"
    before = metric(decode, src, source="external_kv_transfer")
    px = f"http://{deployed.bed.addresses['h3']}:18000/v1/completions"
    status, body = fetch(px, {"model": "tiny", "prompt": PROMPT, "max_tokens": 4})
    assert status == 200, body
    assert metric(decode, src, source="external_kv_transfer") - before >= 32


def test_the_proxy_runs_from_the_bundle_with_its_own_python(deployed: Deployed) -> None:
    st = deployed.state()
    rec = next(p for p in st["processes"] if p["name"] == "proxy")
    cmd = on_host(deployed.bed, "h3", ["cat", f"/proc/{rec['pid']}/cmdline"]).stdout.split("\0")
    assert cmd[:3] == [deployed.proxy_python, "-m", "kvpd.proxy"], cmd
    environ = on_host(deployed.bed, "h3", ["cat", f"/proc/{rec['pid']}/environ"]).stdout
    assert f"PYTHONPATH={st['run_dirs']['px']}/bundle/proxy" in environ.split("\0")


def test_second_up_reinstalls_nothing(deployed: Deployed) -> None:
    kvpd(deployed.state_dir, "down", str(deployed.profile), timeout=300)
    r = kvpd(deployed.state_dir, "up", str(deployed.profile), "--yes", "--json")
    assert json.loads(r.stdout)["status"] == "up"
    again = deployed.bundle()
    assert {k: v["action"] for k, v in again.items()} == {k: "kept" for k in again}, again
    st = kvpd(deployed.state_dir, "status", NAME, "--json")
    shown = {(b["host"], b["slot"]): b["implementation"] for b in json.loads(st.stdout)["bundle"]}
    assert shown[("p1", "engine")] == "native"


def test_down_purge_removes_the_run_dirs(deployed: Deployed) -> None:
    run_dirs = deployed.state()["run_dirs"]
    r = kvpd(deployed.state_dir, "down", str(deployed.profile), "--purge", "--json", timeout=300)
    assert set(json.loads(r.stdout)["purged"].values()) == {"removed"}
    for host, d in run_dirs.items():
        assert on_host(deployed.bed, HOSTS[host], ["test", "-e", d]).returncode == 1, host
