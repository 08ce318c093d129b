"""Security class: nothing from a profile reaches a shell, a path or a config file
unchecked. Each test is a hostile profile and the message (or the safe output) it gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvpd.cli.plan_cmd import write_plan_dir
from kvpd.errors import PlanError, ProfileError
from kvpd.plan.build import load_plan
from kvpd.plan.configfiles import ini_text
from kvpd.plan.value import FileSpec, Plan

LW = "layerwise-sparse-1p1d"
UCM = "ucm-centralized-2p2d"


def error(name: str, *sets: str) -> str:
    with pytest.raises(ProfileError) as e:
        load_plan(name, sets=list(sets), base_dir="/srv/kvpd")
    return str(e.value)


def test_env_name_with_shell_metacharacters_is_refused_with_its_line() -> None:
    msg = error(LW, "env={'EVIL;touch /tmp/x;X': '1'}")
    assert (
        "env.EVIL;touch /tmp/x;X: 'EVIL;touch /tmp/x;X' is not an environment variable "
        "name; use letters, digits and '_'" in msg
    )


@pytest.mark.parametrize("where", ["env", "engine.env", "decode.env"])
def test_every_env_map_checks_names(where: str) -> None:
    assert "is not an environment variable name" in error(LW, f"{where}={{'A B': '1'}}")


def test_host_name_that_is_a_path_is_refused() -> None:
    text = Path(__file__).parents[2].joinpath("kvpd/profiles/local.yaml").read_text()
    bad = text.replace("localhost:", "../../../../tmp/x:", 1)
    assert bad != text
    from kvpd.profile.load import parse_profile

    with pytest.raises(ProfileError) as e:
        parse_profile(bad, "p.yaml")
    assert "hosts.../../../../tmp/x: ../../../../tmp/x must be a name of letters, digits" in str(
        e.value
    )


def test_out_refuses_a_file_outside_the_directory(tmp_path: Path) -> None:
    plan = Plan(
        deployment="d",
        profile_digest="0",
        hosts=(),
        processes=(),
        files=(FileSpec(host="..", path="x/launch.sh", content="echo\n"),),
    )
    with pytest.raises(PlanError, match="refusing to write"):
        write_plan_dir(plan, tmp_path / "out")
    assert not (tmp_path / "x").exists()


def test_ucm_storage_with_quotes_stays_one_value_and_newlines_are_refused() -> None:
    evil = "/mnt/a\", hit_ratio: 1, x: '#"
    p = load_plan(UCM, sets=[f"kv.ucm.storage={json.dumps(evil)}"], base_dir="/srv/kvpd")
    text = next(f.content for f in p.files if f.path.endswith("ucm.yaml"))
    doc = yaml.safe_load(text)
    cfg = doc["ucm_connectors"][0]["ucm_connector_config"]
    assert cfg["storage_backends"] == evil
    assert "hit_ratio" not in cfg
    assert "x" not in doc
    msg = error(UCM, "kv.ucm.storage=" + json.dumps("/mnt/a\nhit_ratio: 1"))
    assert "kv.ucm.storage: must be one line" in msg


def test_memcache_value_with_newline_is_refused_in_the_schema() -> None:
    msg = error(LW, 'kv.memcache.local_extra={"ock.mmc.client.timeout.seconds": "5\\nx = 1"}')
    assert "kv.memcache.local_extra.ock.mmc.client.timeout.seconds: must be one line" in msg


def test_ini_writer_refuses_what_it_cannot_represent() -> None:
    with pytest.raises(ValueError):
        ini_text([], [("a = b", "1")])
    with pytest.raises(ValueError):
        ini_text([], [("a", "1\nb = 2")])
    assert ini_text(["c"], [("a", "x=y")]) == "# c\na = x=y\n"


@pytest.mark.parametrize("field", ["hosts.p1.address", "proxy.bind", "engine.host"])
def test_addresses_are_validated(field: str) -> None:
    msg = error(LW, f"{field}=192.168.10.2; touch /tmp/x")
    assert "is not an IPv4/IPv6 address or a host name" in msg


def test_numeric_ip_needed_for_memfabric_is_not_resolved() -> None:
    msg = error(LW, "hosts.d1.address=d1.cluster.local")
    assert (
        "must be a numeric IPv4 address, not 'd1.cluster.local'. Set `hosts.d1.ip` to the "
        "host's IPv4 address."
    ) in msg
    p = load_plan(
        LW,
        sets=["hosts.d1.address=d1.cluster.local", "hosts.d1.ip=192.168.20.2"],
        base_dir="/srv/kvpd",
    )
    assert ("VLLM_HOST_IP", "192.168.20.2") in p.process("decode-0").env


def test_hccl_if_ip_given_in_env_must_be_numeric() -> None:
    msg = error(LW, "decode.env={HCCL_IF_IP: 'x;y'}")
    assert "decode.env.HCCL_IF_IP: 'x;y' is not a numeric IP address" in msg


def test_launch_script_quotes_every_value(tmp_path: Path) -> None:
    p = load_plan(
        LW, sets=["env={X: '$(touch pwned); `id`'}", "model.path=/m o'del"], base_dir="/srv/kvpd"
    )
    script = next(f.content for f in p.files if f.path == "decode-0/launch.sh")
    r = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert "export X='$(touch pwned); `id`'" in script
    assert "'/m o'\"'\"'del'" in script


def test_cli_out_with_hostile_host_name_exits_2(tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "name: x\nhardware: cpu\nhosts:\n  ../evil: {address: 127.0.0.1}\n"
        "model: {path: /m}\nmixed: {hosts: [../evil]}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "kvpd.cli.main", "plan", str(prof), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "evil").exists()


def test_env_name_with_trailing_newline_is_refused() -> None:
    from kvpd.profile.load import parse_profile

    text = 'name: x\nhosts: {h: {address: 1.2.3.4}}\nmodel: {path: /m}\nenv: {"A\\n": x}\n'
    with pytest.raises(ProfileError) as e:
        parse_profile(text, "p.yaml")
    assert "env.'A\\n': 'A\\n' is not an environment variable name" in str(e.value)


@pytest.mark.parametrize("field", ["model.path", "runtime.vllm", "rehearsal.python"])
def test_commands_and_paths_are_not_empty(field: str) -> None:
    assert f"{field}: is empty; give the command or path" in error(LW, f"{field}=' '")


def test_out_writes_through_new_private_temporaries_and_replaces_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A neighbour who planted the old predictable temporary name (a symlink to a file of
    theirs) or a symlink at the target gets neither the secret nor a write through it."""
    plan = load_plan("local")
    script = next(f for f in plan.files if f.path.endswith(".sh"))
    target = tmp_path / script.host / script.path
    target.parent.mkdir(parents=True)
    trap = tmp_path / "neighbour"
    trap.write_text("")
    target.with_name(target.name + ".tmp").symlink_to(trap)
    target.symlink_to(trap)
    seen: list[int] = []
    real_fchmod = os.fchmod

    def spy(fd: int, mode: int) -> None:  # the mode the file had while it was written
        seen.append(os.fstat(fd).st_mode & 0o777)
        real_fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", spy)
    write_plan_dir(plan, tmp_path)
    assert trap.read_text() == ""
    assert not target.is_symlink()
    assert target.read_text() == script.content
    assert seen
    assert all(m == 0o600 for m in seen)


@pytest.mark.parametrize(
    "template",
    ["d_{name:>999999999}.log", "d_{name!r}.log", "d_{dp_rank:.>9}.log", "d_{instance:x}.log"],
)
def test_log_name_format_specs_are_refused_with_the_field(template: str) -> None:
    msg = error("local", f"decode.log_name={template}")
    assert "decode.log_name: " in msg
    assert "only {dp_rank} and {instance} a zero-padding" in msg


def test_log_name_zero_padding_is_allowed() -> None:
    plan = load_plan("local", sets=["decode.log_name=decoder_dp_{dp_rank:02d}.log"])
    assert any(p.log == "logs/decoder_dp_00.log" for p in plan.processes)


def test_the_plan_digest_does_not_depend_on_secret_values() -> None:
    """The digest is shown in plans and state: it must not let anyone test guesses of a key."""
    one = load_plan("local", sets=["env.VLLM_API_KEY=abc"])
    two = load_plan("local", sets=["env.VLLM_API_KEY=xyz"])
    assert one.profile_digest == two.profile_digest
    other = load_plan("local", sets=["env.VLLM_API_KEY=abc", "env.OTHER=1"])
    assert other.profile_digest != one.profile_digest
