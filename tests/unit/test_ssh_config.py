"""~/.ssh/config is read for what the profile leaves unset; the profile's fields win."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from kvpd.errors import TransportError
from kvpd.exec.ssh.config import load_ssh_config, route
from kvpd.plan.value import HostSpec

CONFIG = """
Host gpu1
  HostName 10.9.0.11
  User alice
  Port 2201
  IdentityFile {key}
  UserKnownHostsFile {known}
  ProxyJump bastion

Host bastion
  HostName 10.9.0.1
  User jumper
  Port 2200

Host *
  IdentityFile {missing}
"""


@pytest.fixture
def config(tmp_path: Path) -> paramiko.SSHConfig:
    key = tmp_path / "id_test"
    key.write_text("not read here")
    text = CONFIG.format(key=key, known=tmp_path / "kh", missing=tmp_path / "absent")
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return load_ssh_config(str(path))


def test_alias_resolves_hostname_user_port_key_known_hosts_and_jump(
    config: paramiko.SSHConfig, tmp_path: Path
) -> None:
    r = route(HostSpec(name="p0", address="gpu1"), config)
    t = r.target
    assert (t.user, t.address, t.port) == ("alice", "10.9.0.11", 2201)
    assert t.keys == (str(tmp_path / "id_test"),)  # the missing IdentityFile is skipped
    assert r.known_hosts == str(tmp_path / "kh")
    # The jump host is an alias too, resolved through the same file.
    assert [(j.user, j.address, j.port) for j in r.jumps] == [("jumper", "10.9.0.1", 2200)]


def test_profile_fields_override_ssh_config(config: paramiko.SSHConfig, tmp_path: Path) -> None:
    host = HostSpec(
        name="p0",
        address="gpu1",
        user="bob",
        port=2999,
        key="/keys/bob",
        known_hosts="/kh/team",
        jump="root@10.8.0.1:22",
    )
    r = route(host, config)
    assert (r.target.user, r.target.port, r.target.keys) == ("bob", 2999, ("/keys/bob",))
    assert r.target.address == "10.9.0.11"  # the alias still names the machine
    assert r.known_hosts == "/kh/team"
    assert [(j.user, j.address, j.port, j.keys) for j in r.jumps] == [
        ("root", "10.8.0.1", 22, ("/keys/bob",))
    ]


def test_without_a_matching_host_the_profile_is_used_as_is(config: paramiko.SSHConfig) -> None:
    r = route(HostSpec(name="h", address="10.1.2.3", user="u"), config)
    assert (r.target.user, r.target.address, r.target.port, r.jumps) == ("u", "10.1.2.3", 22, ())


def test_missing_file_is_an_empty_config(tmp_path: Path) -> None:
    cfg = load_ssh_config(str(tmp_path / "nope"))
    r = route(HostSpec(name="h", address="gpu1", user="u"), cfg)
    assert r.target.address == "gpu1"


def test_invalid_port_names_the_host(tmp_path: Path) -> None:
    path = tmp_path / "cfg"
    path.write_text("Host bad\n  Port http\n")
    with pytest.raises(TransportError, match="host bad: invalid Port 'http'"):
        route(HostSpec(name="h", address="bad", user="u"), load_ssh_config(str(path)))


def test_jump_host_takes_its_own_key(config: paramiko.SSHConfig, tmp_path: Path) -> None:
    host = HostSpec(
        name="p0", address="10.1.2.3", key="/keys/team", jump="me@bastion", jump_key="/keys/me"
    )
    r = route(host, config)
    assert r.target.keys == ("/keys/team",)
    assert [(j.user, j.address, j.port, j.keys) for j in r.jumps] == [
        ("me", "10.9.0.1", 2200, ("/keys/me",))
    ]


def test_jump_host_uses_ssh_config_key_before_the_targets(tmp_path: Path) -> None:
    personal = tmp_path / "id_bastion"
    personal.write_text("not read here")
    path = tmp_path / "ssh_config"
    path.write_text(f"Host bastion\n  HostName 10.9.0.1\n  IdentityFile {personal}\n")
    host = HostSpec(name="p0", address="10.1.2.3", key="/keys/team", jump="bastion")
    r = route(host, load_ssh_config(str(path)))
    assert r.jumps[0].keys == (str(personal),)
    assert r.target.keys == ("/keys/team",)


@pytest.mark.parametrize("accept", [True, False])
def test_known_hosts_dev_null_is_refused_not_silently_trusting(
    accept: bool, tmp_path: Path
) -> None:
    """`UserKnownHostsFile /dev/null` in ssh_config records no key: with --accept-new-host-keys
    every connection would accept whatever key a host (or a man in the middle) offers."""
    from kvpd.errors import HostKeyError
    from kvpd.exec.ssh.hostkeys import verify_with

    cfg = tmp_path / "config"
    cfg.write_text("Host lab\n  UserKnownHostsFile /dev/null\n")
    r = route(HostSpec("n1", "lab", user="me"), load_ssh_config(str(cfg)))
    assert r.known_hosts == "/dev/null"
    with pytest.raises(HostKeyError) as e:
        verify_with(paramiko.SSHClient(), r.known_hosts, "host n1", accept_unknown=accept)
    assert "/dev/null is not a regular file" in str(e.value)
    assert "Fix:" in str(e.value)
    assert ("would accept any key" in str(e.value)) is accept
