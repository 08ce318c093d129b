"""Command lines built for remote shells, checked with the real local shells (dash, bash)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from kvpd.errors import PlanError
from kvpd.exec.command_words import check_env, quote_word
from kvpd.exec.ssh.commands import command_line, detached_command_line, group_stats_snippet
from kvpd.exec.ssh.config import parse_jump

SHELLS = [s for s in ("sh", "dash", "bash") if shutil.which(s)]
HOSTILE = [
    "plain",
    "with space",
    "it's",
    'dq"',
    "$(touch canary)",
    "`touch canary`",
    "; touch canary",
    "&& touch canary",
    "a\nb",
    "*",
    "?",
    "~",
    "$HOME",
    "\\",
    "a=b",
    "-n",
    "!",
    "#x",
    "{a,b}",
    "tab\t",
    "ü",
    "",
]


@pytest.mark.parametrize("shell", SHELLS)
def test_argv_env_and_cwd_arrive_verbatim(shell, tmp_path) -> None:
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    code = (
        "import os, sys; vals = [os.getcwd()] + [os.environ[f'V{i}'] for i in range(COUNT)]; "
        "sys.stdout.write('\\0'.join(vals + sys.argv[1:]))"
    ).replace("COUNT", str(len(HOSTILE)))
    line = command_line([sys.executable, "-c", code, *HOSTILE], env=env, cwd=str(tmp_path))
    r = subprocess.run([shell, "-c", line], capture_output=True, cwd="/", timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split("\0") == [str(tmp_path), *HOSTILE, *HOSTILE]
    assert not (tmp_path / "canary").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_command_name_is_never_an_assignment_or_expansion(shell, tmp_path) -> None:
    for word in ("a=b", "$(touch canary)", "*", "~"):
        r = subprocess.run(
            [shell, "-c", command_line([word], cwd=str(tmp_path))], capture_output=True, timeout=10
        )
        assert r.returncode == 127, (word, r)
    assert list(tmp_path.iterdir()) == []


def test_every_word_is_quoted() -> None:
    assert quote_word("a=b") == "'a=b'"
    assert quote_word("") == "''"
    assert quote_word("it's") == "'it'\"'\"'s'"
    with pytest.raises(PlanError, match="NUL"):
        quote_word("a\0b")


@pytest.mark.parametrize("name", ["A B", "1A", "A-B", "$(x)", "A=B", "", "A\nB", "Ä"])
def test_invalid_env_names_rejected(name) -> None:
    with pytest.raises(PlanError, match="invalid environment variable name"):
        check_env({name: "x"})


def test_bad_commands_rejected() -> None:
    with pytest.raises(PlanError):
        command_line([])
    with pytest.raises(PlanError, match="must not start with '-'"):
        command_line(["-x"])
    with pytest.raises(PlanError, match="NUL"):
        check_env({"A": "x\0"})


@pytest.mark.parametrize("shell", SHELLS)
def test_generated_snippets_parse(shell) -> None:
    for line in (
        detached_command_line(["a b", "$(x)"], log="/l o/g", cwd="/c d", env={"A": "'"}),
        group_stats_snippet(123),
    ):
        r = subprocess.run([shell, "-n", "-c", line], capture_output=True, timeout=10)
        assert r.returncode == 0, (line, r.stderr)


def test_group_snippet_lists_own_group() -> None:
    import os

    out = subprocess.run(
        ["sh", "-c", group_stats_snippet(os.getpgrp())], capture_output=True, text=True, timeout=10
    ).stdout
    assert any(line.startswith(f"{os.getpid()} (") for line in out.splitlines())


def test_parse_jump() -> None:
    hops = parse_jump("bastion, alice@gw:2222,[fd00::1]:23")
    assert [(h.user, h.address, h.port) for h in hops] == [
        (None, "bastion", None),  # unset: from ssh_config, else the target's user and 22
        ("alice", "gw", 2222),
        (None, "fd00::1", 23),
    ]
    assert parse_jump(None) == []
    with pytest.raises(PlanError):
        parse_jump("a@b:c")


def test_secret_env_never_reaches_the_ssh_command_line(monkeypatch, tmp_path) -> None:
    """A token in the command line sshd runs is in `ps` for every local user of the host: it
    goes through a private file the command sources and deletes."""
    import subprocess

    from kvpd.exec.ssh import SSHTransport
    from kvpd.plan.value import HostSpec

    t = SSHTransport(HostSpec("h", "192.0.2.1", user="me"))
    written: dict[str, tuple[bytes, int]] = {}
    sent: list[str] = []
    monkeypatch.setattr(t, "home", lambda: str(tmp_path))
    monkeypatch.setattr(t, "put", lambda p, c, *, mode: written.__setitem__(p, (c, mode)))
    monkeypatch.setattr(t, "_result", lambda argv, command, *_: sent.append(command))
    token = 'hf_abc\'; echo pwned $(id) "x"'
    t.run(["sh", "-c", 'printf %s "$HF_TOKEN"'], env={"HF_TOKEN": token, "MODE": "fast"})
    ((path, (content, mode)),) = written.items()
    assert mode == 0o600
    assert token not in sent[0]
    assert "export MODE='fast'" in sent[0]
    (tmp_path / path.rsplit("/", 1)[1]).write_bytes(content)
    out = subprocess.run(["sh", "-c", sent[0]], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout == token
    assert not (tmp_path / path.rsplit("/", 1)[1]).exists()


def test_secret_env_of_a_detached_start_never_reaches_the_command_line(monkeypatch) -> None:
    from kvpd.exec.ssh import SSHTransport
    from kvpd.plan.value import HostSpec

    t = SSHTransport(HostSpec("h", "192.0.2.1", user="me"))
    written: list[bytes] = []
    sent: list[str] = []
    monkeypatch.setattr(t, "home", lambda: "/home/me")
    monkeypatch.setattr(t, "put", lambda p, c, *, mode: written.append(c))

    def exec_(command: str, timeout_s: float) -> tuple[int, bytes, bytes, bool]:
        sent.append(command)
        return 0, b"4242\n", b"", False

    monkeypatch.setattr(t, "_exec", exec_)
    t.start_detached(["vllm"], log="/r/l.log", cwd="/r", env={"VLLM_API_KEY": "sk-value"})
    assert "sk-value" not in sent[0]
    assert b"VLLM_API_KEY='sk-value'" in written[0]


def test_a_start_keeps_the_identity_of_a_process_that_exits_at_once(tmp_path) -> None:
    """The started process reports its own stat line before it execs: a command that exits at
    once (a launcher that forks and leaves) still gets its start time, in every run."""
    from kvpd.exec.ssh.processes import started

    for _ in range(20):
        line = detached_command_line(["true"], log=str(tmp_path / "l.log"), cwd=str(tmp_path))
        out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=10)
        s = started(out.stdout.splitlines(), "l.log")
        assert s.start_ticks > 0, out.stdout


def test_start_output_is_read_in_either_order() -> None:
    from kvpd.errors import TransportError
    from kvpd.exec.ssh.processes import started

    stat = "4242 (sh) S 1 4242 4242 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0"
    assert started(["4242", stat], "/l").start_ticks == 777
    assert started([stat, "4242"], "/l").start_ticks == 777
    assert started(["4242"], "/l").start_ticks == 0  # unknown: never signalled (may_signal_group)
    assert started(["4242", stat.replace("4242 (", "4243 (")], "/l").start_ticks == 0
    with pytest.raises(TransportError, match="no PID"):
        started([stat], "/l")
