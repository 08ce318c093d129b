"""`bench.host`: the client runs on a cluster host through the deployment service (here the
real local transport standing in for SSH), its result file comes back into the local results
folder, and kvpd writes only inside that host's run dir."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvpd.bench import runner
from kvpd.bench.remote import RemoteClient, default_host, where
from kvpd.errors import ProfileError
from kvpd.exec.local import LocalTransport
from kvpd.exec.service import Deployments
from kvpd.exec.state import StateStore
from kvpd.plan.build import load_plan
from kvpd.plan.value import HostSpec, Plan

# A stand-in for `vllm bench serve` (no vLLM client needed): it writes the result file where
# --result-dir/--result-filename say and prints the last line of a real run's summary.
STAND_IN = """#!{python}
import json, os, sys
a = sys.argv[1:]
d, f = a[a.index("--result-dir") + 1], a[a.index("--result-filename") + 1]
json.dump({{"completed": 3, "failed": 0, "argv": a, "env": dict(os.environ)}},
          open(os.path.join(d, f), "w"))
print("Successful requests:                     3")
"""


def test_client_runs_on_the_host_and_results_come_back(tmp_path: Path) -> None:
    cluster = tmp_path / "node"  # the host's login dir
    cluster.mkdir()
    client = cluster / "vllm"
    client.write_text(STAND_IN.format(python=sys.executable))
    client.chmod(0o755)
    plan = Plan("dep", "d", (HostSpec("p1", "10.0.0.1", run_dir="run"),), (), (),
                tokenizer="/models/QwQ-32B")  # fmt: skip
    service = Deployments(
        StateStore(tmp_path / "state"), transports={"p1": LocalTransport(base_dir=str(cluster))}
    )
    local = tmp_path / "results" / "raw" / "ucm"
    local.mkdir(parents=True)
    phase = runner.Phase("measured", 32000, 1000, 3, 1, "inf", None, True)
    argv = runner.build_argv("/here/vllm", phase, base_url="http://10.0.0.1:7850", model="m",
                             tokenizer="/models/QwQ-32B", result_dir=str(local),
                             result_filename="x.json")  # fmt: skip
    env = runner.client_env("/models/QwQ-32B", "http://10.0.0.1:7850")
    env["SECRET_OF_THIS_MACHINE"] = "not sent"
    run = RemoteClient(service, plan, "p1", "20260101-000000", str(client))
    out = run(argv, env=env, log=local / "x.log", timeout_s=60)
    assert out.returncode == 0
    assert "Successful requests" in out.stdout
    got = json.loads((local / "x.json").read_text())  # copied back
    remote_dir = cluster / "run" / "bench" / "20260101-000000" / "ucm"
    assert (remote_dir / "x.json").is_file()  # written inside the host's run dir
    assert got["argv"][got["argv"].index("--result-dir") + 1] == str(remote_dir)
    assert got["env"]["HF_HUB_OFFLINE"] == "1"
    assert "SECRET_OF_THIS_MACHINE" not in got["env"]
    assert out.argv[:4] == ["timeout", "-k", "10", "60"]
    assert "(p1)" in (local / "x.log").read_text()


def test_default_client_host_and_the_bench_host_field() -> None:
    p = load_plan("large-ep", sets=["bench.input_len=16000"])
    assert default_host(p, local_ok=True) is None
    assert default_host(p, local_ok=False) == "p1"  # the proxy's host
    assert where(p, "p1") == "p1, the proxy's host (bench.host unset)"
    assert where(load_plan("large-ep", sets=["bench.host=d2"]), "d2") == "d2 (bench.host)"
    assert where(p, None) == "this machine"
    assert load_plan("large-ep", sets=["bench.host=d2"]).bench.host == "d2"
    with pytest.raises(ProfileError) as e:
        load_plan("large-ep", sets=["bench.host=d9"])
    assert "bench.host: 'd9' is not a host of this profile. Did you mean 'd4'?" in str(e.value)
    assert "or `local` for this machine" in str(e.value)
    assert load_plan("local", sets=["bench.host=local"]).bench.host == "local"


def test_the_run_records_where_the_client_ran() -> None:
    from kvpd.bench.records import BenchRun

    run = BenchRun("p", "d", "x", "plain", "now", client=where(load_plan("large-ep"), "p1"))
    back = BenchRun.from_dict(run.to_dict())
    assert back.client == "p1, the proxy's host (bench.host unset)"


def test_a_route_to_the_proxy_decides_whether_the_client_may_run_here() -> None:
    import socket

    from kvpd.exec.http_wire import route_here

    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        assert route_here("127.0.0.1", port)
    assert route_here("127.0.0.1", port)  # refused: the host answered
    assert not route_here("255.255.255.255", 8000, timeout_s=0.3)  # no TCP to broadcast


def test_a_proxy_behind_a_jump_host_is_never_tried_from_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kvpd reaches the proxy's host through a bastion: the client belongs on the cluster, and
    no socket goes from here to the cluster port (255.255.255.255 would fail anyway)."""
    from kvpd.cli.bench_cmd import _route_to_proxy
    from kvpd.plan.value import ProcessSpec

    proxy = ProcessSpec(name="proxy", host="p1", role="proxy", stage=1, script="p.sh",
                        command=("kvpd-proxy",), ports=(8000,))  # fmt: skip
    monkeypatch.setenv("KVPD_SSH_CONFIG", "none")  # this machine's ~/.ssh/config aside
    for jump, reachable in ((None, True), ("root@10.0.1.10", False)):
        host = HostSpec("p1", "127.0.0.1", jump=jump)
        plan = Plan("dep", "d", (host,), (), (proxy,), proxy_url="http://127.0.0.1:1")
        assert _route_to_proxy(plan) is reachable  # refused here counts as a route


def test_a_proxy_jumped_to_by_ssh_config_is_never_tried_from_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bastion is named only in ~/.ssh/config (ProxyJump): kvpd's route goes through it,
    so the client belongs on the cluster and no socket to the cluster port is tried."""
    from kvpd.cli import bench_cmd
    from kvpd.plan.value import ProcessSpec

    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host 127.0.0.1\n  ProxyJump root@10.0.1.10\n")
    monkeypatch.setenv("KVPD_SSH_CONFIG", str(tmp_path / ".ssh" / "config"))
    tried: list[tuple[str, int]] = []
    monkeypatch.setattr("kvpd.exec.http_wire.route_here", lambda a, p: tried.append((a, p)))
    proxy = ProcessSpec(name="proxy", host="p1", role="proxy", stage=1, script="p.sh",
                        command=("kvpd-proxy",), ports=(8000,))  # fmt: skip
    host = HostSpec("p1", "127.0.0.1", transport="ssh")
    plan = Plan("dep", "d", (host,), (), (proxy,), proxy_url="http://127.0.0.1:1")
    assert bench_cmd._route_to_proxy(plan) is False
    assert tried == []
