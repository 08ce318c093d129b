"""Containers on the nodes: the profile setting, the runtime command lines kvpd
renders (golden files), and commands run inside a container through its runtime's exec (the
namespace stand-in: Docker and Podman cannot run containers on these machines)."""

from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path

import pytest

from kvpd.errors import ProfileError, TransportError
from kvpd.exec.containers.transport import ContainerTransport
from kvpd.exec.local import LocalTransport
from kvpd.plan.build import load_plan
from kvpd.plan.value import Plan
from tests.unit.standin import spec, standin_container

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "containers"
UCM = "ucm-centralized-2p2d"
IMAGE = "quay.io/ascend/vllm-ascend:v0.11.0rc1"
SETS = {
    "docker-exec": ["hosts.p1.container={name: vllm-ascend, runtime: docker}"],
    "podman-image": [f'hosts.d1.container={{image: "{IMAGE}", runtime: podman}}'],
    "docker-image-shm": [
        f'hosts.p1.container={{image: "{IMAGE}", name: vllm-p, runtime: docker, shm_gb: 200}}'
    ],
}


def _plan(*sets: str) -> Plan:
    return load_plan(UCM, base_dir="/srv/kvpd", sets=["runtime.run_dir=/data/kvpd/run", *sets])


def _rendered(plan: Plan) -> str:
    out = []
    for h in plan.hosts:
        if h.container is not None:
            out.append(f"# {h.name}")
            out.append(shlex.join(h.container.exec_argv(["sh", "-c", "..."])))
            out.append(shlex.join(h.container.run_argv()))
            out.append(shlex.join(h.container.rm_argv()))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("case", sorted(SETS))
def test_runtime_command_lines_match_the_golden_files(case: str, update_golden: bool) -> None:
    got = _rendered(_plan(*SETS[case]))
    path = GOLDEN / f"{case}.txt"
    if update_golden:
        path.write_text(got)
    assert got == path.read_text()


def test_devices_follow_the_plans_npu_assignment_and_shm_the_ucm_buffers() -> None:
    plan = _plan(*SETS["podman-image"], "decode.instances=1")
    c = plan.host("d1").container
    assert c is not None
    assert c.started_by_kvpd
    assert [d for d in c.devices if d[-1].isdigit()] == [f"/dev/davinci{n}" for n in range(4)]
    assert c.shm_gb == 1  # a GQA model: UCM's cache buffer is not in /dev/shm; headroom only
    shared = _plan(*SETS["podman-image"], "decode.instances=1",
                   "kv.ucm.config={share_buffer_enable: true}")  # fmt: skip
    c = shared.host("d1").container
    assert c is not None
    assert c.shm_gb == 64 + 1  # ucm cache_buffer_capacity_gb + headroom
    assert "/data/kvpd/run:/data/kvpd/run" in c.mounts
    assert "/mnt/test1:/mnt/test1" in c.mounts
    assert plan.host("p1").container is None


def test_plan_json_round_trips_and_hosts_without_container_keep_their_form() -> None:
    plan = _plan(*SETS["docker-exec"])
    d = plan.to_dict()
    assert "container" in d["hosts"][0]
    assert "container" not in d["hosts"][1]
    assert Plan.from_dict(d) == plan


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["hosts.p1.container={runtime: lxc, name: ca}"],
            "hosts.p1.container.runtime: runtime must be one of 'docker', 'podman' or "
            "'standin', not 'lxc'.",
        ),
        (
            ["hosts.p1.container={name: '-it'}"],
            "hosts.p1.container.name: name must be a container name of letters",
        ),
        (
            ["hosts.p1.container={image: 'Vllm Ascend'}"],
            "hosts.p1.container.image: image must be an image reference",
        ),
        (["hosts.p1.container={shm_gb: 0, name: ca}"], "hosts.p1.container.shm_gb:"),
        (["hosts.p1.container={runtime: docker}"], "hosts.p1.container: give `name`"),
        (
            ["hosts.p1.container={name: ca, runtime: standin}"],
            "hosts.p1.container.runtime: standin is kvpd's namespace stand-in for tests",
        ),
        (["hosts.p1.container={nme: a}"], "hosts.p1.container.nme"),
    ],
)
def test_failing_profiles_name_the_field_and_the_fix(sets: list[str], message: str) -> None:
    with pytest.raises(ProfileError) as e:
        _plan(*sets)
    assert message in str(e.value)


def test_a_relative_run_dir_cannot_be_mounted() -> None:
    with pytest.raises(ProfileError) as e:
        load_plan(UCM, base_dir="/srv", sets=SETS["docker-exec"])
    assert "hosts.p1.container: the run dir is mounted into the container at the same path, " \
        "so it must be absolute" in str(e.value)  # fmt: skip


# -- inside the stand-in ------------------------------------------------------------------


def test_processes_inside_have_the_containers_pids_and_die_with_it(tmp_path: Path) -> None:
    host = LocalTransport(base_dir=str(tmp_path))
    with standin_container(host) as t:
        s = t.start_detached(["sleep", "300"], log=f"{tmp_path}/s.log", cwd=str(tmp_path))
        # PID as seen inside: the stand-in's init is 1, so ours is small; the host has no
        # such sleep at that number (or a different process).
        assert s.pid < 100
        assert t.alive(s.pid, start_ticks=s.start_ticks)
        assert t.group_alive(s.pgid) == [s.pid]
        t.put(f"{tmp_path}/token", b"from the host")  # files: through the host, same path
        assert t.run(["cat", f"{tmp_path}/token"]).stdout == "from the host"
        assert t.signal_group(s.pgid, signal.SIGTERM, start_ticks=s.start_ticks)
        deadline = time.monotonic() + 5
        while t.group_alive(s.pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert t.group_alive(s.pgid) == []
        t.start_detached(["sleep", "300"], log=f"{tmp_path}/s2.log", cwd=str(tmp_path))
        name = t.spec.name
    # `rm` killed the namespace's init, hence everything inside.
    r = host.run(spec(name).exec_argv(["true"]))
    assert not r.ok
    assert "No such container" in r.stderr


def test_runtime_failures_say_what_to_do(tmp_path: Path) -> None:
    host = LocalTransport(base_dir=str(tmp_path))
    with standin_container(host):
        pass
    missing = ContainerTransport(host, spec("kvpd-no-such-container"))
    with pytest.raises(TransportError, match="does not exist. Fix: start it"):
        missing.alive(1)
    no_runtime = ContainerTransport(
        host, spec("x").__class__(runtime="docker", command="kvpd-no-docker-here", name="x")
    )
    with pytest.raises(TransportError, match="runtime is not installed on the host"):
        no_runtime.ports_listening([1])


# -- lifecycle and preflight (local host, stand-in runtime) --------------------------------


def _standin_plan(tmp_path: Path, name: str, **extra: str) -> Plan:
    from tests.unit.standin import STANDIN

    fields = {"runtime": "standin", "command": STANDIN, "name": name, **extra}
    inline = ", ".join(f'{k}: "{v}"' for k, v in fields.items())
    return load_plan(
        "local", base_dir=str(tmp_path), sets=[f"hosts.localhost.container={{{inline}}}"]
    )


def test_up_starts_only_its_containers_and_down_removes_only_those(tmp_path: Path) -> None:
    from kvpd.errors import DeployError
    from kvpd.exec.containers.life import inspect, remove_containers, start_containers
    from kvpd.exec.containers.preflight import preflight_checks
    from kvpd.exec.pool import TransportPool
    from kvpd.exec.report import NullReporter
    from tests.unit.standin import can_unshare

    if not can_unshare():
        pytest.skip("the namespace stand-in needs root and unshare/nsenter")
    name = f"kvpd-t-{tmp_path.name[-12:].strip('_')}"
    plan = _standin_plan(tmp_path, name, image="standin")
    c = plan.host("localhost").container
    assert c is not None
    assert c.started_by_kvpd
    pool = TransportPool(plan.hosts)
    host = pool["localhost"].inner  # type: ignore[attr-defined]
    try:
        missing = {ch.name: ch for ch in preflight_checks(plan, pool.__getitem__)}
        assert not missing[f"container {name}"].ok
        assert missing[f"container {name}"].fix == "`kvpd up` starts it"
        start_containers(plan, pool, NullReporter())
        start_containers(plan, pool, NullReporter())  # idempotent: kept running
        checks = {ch.name: ch for ch in preflight_checks(plan, pool.__getitem__)}
        assert checks[f"container {name}"].ok, checks
        assert checks["run dir inside"].ok, checks["run dir inside"]
        assert remove_containers(plan, pool, NullReporter()) == []
        assert inspect(host, c, "localhost") is None
        # A container of that name kvpd did not start is neither reused nor removed.
        assert host.run(c.__class__(**{**c.to_dict(), "deployment": "other"}).run_argv()).ok
        with pytest.raises(DeployError, match="exists that kvpd did not start"):
            start_containers(plan, pool, NullReporter())
        assert remove_containers(plan, pool, NullReporter()) == []
        assert inspect(host, c, "localhost") is not None
    finally:
        host.run(c.rm_argv())
        pool.close()


def test_preflight_names_a_missing_container_and_a_missing_runtime(tmp_path: Path) -> None:
    from kvpd.exec.containers.preflight import preflight_checks
    from kvpd.exec.pool import TransportPool

    plan = _standin_plan(tmp_path, "kvpd-no-such-container")
    pool = TransportPool(plan.hosts)
    try:
        (check,) = preflight_checks(plan, pool.__getitem__)
        assert not check.ok
        assert "no such container" in check.detail
        assert "start it (`kvpd plan` shows the standin run line)" in check.fix
    finally:
        pool.close()
    plan = _standin_plan(tmp_path, "cx", command="/nonexistent/docker")
    pool = TransportPool(plan.hosts)
    try:
        (check,) = preflight_checks(plan, pool.__getitem__)
        assert not check.ok
        assert "runtime is not installed on the host" in check.detail
    finally:
        pool.close()


def test_kvpd_plan_shows_the_exec_and_run_lines_and_names_the_stand_in(tmp_path: Path) -> None:
    from kvpd.cli.container_view import plan_lines

    text = "\n".join(plan_lines(_plan(*SETS["docker-exec"])))
    assert "p1: container vllm-ascend (docker; you run it; kvpd only execs into it)" in text
    assert "exec: docker exec vllm-ascend sh -c ..." in text
    assert "run:  docker run -d --name vllm-ascend" in text
    assert " IMAGE sleep infinity" in text
    text = "\n".join(plan_lines(_standin_plan(tmp_path, "c1")))
    assert "namespace STAND-IN for tests, not a container runtime" in text
    assert plan_lines(load_plan(UCM, base_dir="/srv")) == []


def test_a_stopped_container_and_a_denied_socket_say_what_to_do(tmp_path: Path) -> None:
    import os

    from kvpd.exec.containers.preflight import preflight_checks
    from kvpd.exec.containers.transport import runtime_failure
    from kvpd.exec.pool import TransportPool
    from kvpd.exec.transport import CommandResult

    denied = CommandResult(
        ("docker",), 1, "", "permission denied while trying to connect to the Docker daemon "
        "socket at unix:///var/run/docker.sock"
    )  # fmt: skip
    msg = runtime_failure(spec("c"), "p1", denied) or ""
    assert "cannot reach the runtime's socket. Fix: run podman rootless" in msg
    assert "root-equivalent on the host" in msg
    host = LocalTransport(base_dir=str(tmp_path))
    with standin_container(host) as t:
        netns = "".join(ch for ch in os.readlink("/proc/self/ns/net") if ch.isdigit())
        state = Path(os.environ.get("KVPD_STANDIN_STATE", "/run/kvpd-standin")) / netns
        os.kill(int((state / f"{t.spec.name}.pid").read_text()), signal.SIGKILL)  # it stops
        time.sleep(0.2)
        plan = _standin_plan(tmp_path, t.spec.name)
        pool = TransportPool(plan.hosts)
        try:
            (check,) = preflight_checks(plan, pool.__getitem__)
        finally:
            pool.close()
        assert not check.ok
        assert check.detail.startswith("exited, not running")
        assert check.fix.endswith(f"kvpd-standin-runtime start {t.spec.name}")
        with pytest.raises(TransportError, match="the container is stopped. Fix: "):
            t.alive(1)


def test_a_groups_container_applies_to_its_hosts_and_groups_sharing_a_host_must_agree() -> None:
    plan = _plan("decode.container={name: vllm-ascend}")
    c = plan.host("d1").container
    assert c is not None
    assert c.name == "vllm-ascend"
    assert plan.host("p1").container is None
    own = _plan("decode.container={name: ca}", "hosts.d1.container={name: cb}")
    assert own.host("d1").container.name == "cb"  # type: ignore[union-attr]
    with pytest.raises(ProfileError) as e:
        _plan(
            "prefill.container={name: ca}",
            "decode.container={name: cb}",
            "decode.hosts=[p1]",
            "hosts.p1.devices=16",
        )
    assert (
        "decode.container: host 'p1' runs prefill and decode with different containers; one "
        "host runs one container: give them the same one or set hosts.p1.container."
    ) in str(e.value)


def test_model_folders_are_mounted_read_only_and_storage_read_write() -> None:
    """An engine never writes its model: a compromised one must not rewrite the weights or the
    tokenizer its peers load from the same folder."""
    from types import SimpleNamespace

    from kvpd.plan.container import container_spec

    c = SimpleNamespace(runtime="docker", command=None, name="n", image="IMAGE", shm_gb=None)
    dirs = (("/models/m",), ("/mnt/kv",))
    spec = container_spec(c, deployment="d", hardware="cpu", npus=(), shm_needed_gb=0.0,
                          run_dir="/data/run", data_dirs=dirs)  # fmt: skip
    assert spec.mounts == ("/models/m:/models/m:ro", "/mnt/kv:/mnt/kv", "/data/run:/data/run")


def test_secret_env_is_passed_by_name_not_on_the_runtime_command_line() -> None:
    """`docker exec ... sh -c 'export VLLM_API_KEY=...'` would show the key in `ps` on the
    host: the runtime gets `-e NAME` and the value through the host transport's environment."""
    from kvpd.exec.transport import CommandResult
    from tests.unit.standin import spec

    calls: list[tuple[list[str], dict[str, str] | None]] = []

    class Host(LocalTransport):
        def run(self, argv, **opts):
            calls.append((list(argv), opts.get("env")))
            return CommandResult(tuple(argv), 0, "4242\n", "")

    t = ContainerTransport(Host(), spec("c"))
    t.run(["true"], env={"VLLM_API_KEY": "sk-secret-value", "MODE": "x"})
    t.start_detached(["vllm"], log="/r/l.log", cwd="/r", env={"HF_TOKEN": "hf_secret"})
    for (argv, env), name, value in zip(
        calls, ("VLLM_API_KEY", "HF_TOKEN"), ("sk-secret-value", "hf_secret"), strict=True
    ):
        assert not any(value in w for w in argv)
        assert argv[argv.index("-e") + 1] == name
        assert env == {name: value}


@pytest.mark.parametrize("out", ["4242\n{stat}\n", "{stat}\n4242\n", "{stat}\n4242\n{stat}\n"])
def test_a_start_takes_the_pid_and_its_stat_line_in_either_order(out: str) -> None:
    """The started process prints its own stat line while the shell that started it prints its
    PID: either may reach the channel first."""
    from kvpd.exec.transport import CommandResult

    stat = "4242 (sh) S 1 4242 4242 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 987654 0 0"

    class Host(LocalTransport):
        def run(self, argv, **opts):
            return CommandResult(tuple(argv), 0, out.format(stat=stat), "")

    s = ContainerTransport(Host(), spec("c")).start_detached(["vllm"], log="/r/l.log", cwd="/r")
    assert (s.pid, s.pgid, s.start_ticks) == (4242, 4242, 987654)
