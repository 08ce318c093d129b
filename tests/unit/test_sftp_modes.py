"""SFTP writes send the owner-only mode in the OPEN request itself (no window in which another
local user can read a token or a launch script), new-only, and make directories 0700."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from paramiko.sftp import CMD_HANDLE, CMD_OPEN, SFTP_FLAG_CREATE, SFTP_FLAG_EXCL, SFTP_FLAG_WRITE

from kvpd.exec.ssh import sftp


class _Recording:
    """Stands in for paramiko's SFTPClient at the request level (no server needed)."""

    def __init__(self) -> None:
        self.requests: list[tuple] = []
        self.dirs: dict[str, int] = {}
        self.chmods: dict[str, int] = {}

    def open(self, *a: object, **k: object) -> None:
        raise AssertionError("SFTPClient.open sends no permissions: the file starts 0644")

    def _request(self, t: int, *args: object) -> tuple[int, paramiko.Message]:
        self.requests.append((t, *args))
        msg = paramiko.Message()
        msg.add_string(b"h1")
        msg.rewind()
        return CMD_HANDLE, msg

    def _log(self, *a: object) -> None:
        return None

    def _async_request(self, *a: object) -> int:
        return 1

    def _write(self, *a: object) -> None:  # the pipelined write path
        return None

    def stat(self, path: str) -> paramiko.SFTPAttributes:
        if path in ("/", "/home", "/home/u") or path in self.dirs:
            a = paramiko.SFTPAttributes()
            a.st_mode = 0o40700
            return a
        raise FileNotFoundError(path)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        self.dirs[path] = mode

    def chmod(self, path: str, mode: int) -> None:
        self.chmods[path] = mode


def test_the_temporary_file_is_created_owner_only_and_new(monkeypatch) -> None:
    monkeypatch.setattr(paramiko.SFTPFile, "write", lambda self, data: None)
    monkeypatch.setattr(paramiko.SFTPFile, "close", lambda self: None)
    monkeypatch.setattr(paramiko.SFTPFile, "set_pipelined", lambda self, p=True: None)
    client = _Recording()
    sftp.write_temp(client, "/home/u/run/conf/.token.x.tmp", b"secret", 0o640)  # type: ignore[arg-type]
    (t, path, flags, attrs), *_ = client.requests
    assert (t, path) == (CMD_OPEN, "/home/u/run/conf/.token.x.tmp")
    assert flags == SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL
    assert attrs.st_mode == 0o600  # the final mode's owner bits, nothing for others yet
    assert client.chmods == {"/home/u/run/conf/.token.x.tmp": 0o640}
    assert client.dirs == {"/home/u/run": 0o700, "/home/u/run/conf": 0o700}


SFTP_SERVER = next(
    (p for p in ("/usr/lib/openssh/sftp-server", "/usr/lib/sftp-server") if Path(p).exists()), None
)


class _Pair:
    """One end of a socketpair as the channel paramiko's SFTP client talks over."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> int:
        return self.sock.send(data)

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def close(self) -> None:
        self.sock.close()

    def settimeout(self, t: float | None) -> None:
        self.sock.settimeout(t)

    def get_name(self) -> str:
        return "socketpair"


@pytest.fixture
def real_sftp() -> Iterator[paramiko.SFTPClient]:
    """OpenSSH's own sftp-server on a socketpair: the server side of every SSH host's SFTP."""
    if SFTP_SERVER is None:
        pytest.skip("no OpenSSH sftp-server")
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([SFTP_SERVER], stdin=theirs.fileno(), stdout=theirs.fileno())
    theirs.close()
    client = paramiko.SFTPClient(_Pair(ours))
    try:
        yield client
    finally:
        client.close()
        proc.kill()
        proc.wait()


def test_openssh_creates_the_file_owner_only_until_its_final_mode(
    real_sftp: paramiko.SFTPClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modes: list[int] = []
    real_chmod = real_sftp.chmod

    def chmod(path: str, mode: int) -> None:  # what the file was while its content went in
        modes.append(stat.S_IMODE(os.stat(path).st_mode))
        real_chmod(path, mode)

    monkeypatch.setattr(real_sftp, "chmod", chmod)
    tmp = f"{tmp_path}/run/conf/.launch.sh.1.tmp"
    sftp.write_temp(real_sftp, tmp, b"export VLLM_API_KEY=secret\n", 0o755)
    assert modes == [0o700]
    assert stat.S_IMODE(os.stat(tmp).st_mode) == 0o755
    assert [stat.S_IMODE(os.stat(f"{tmp_path}/{d}").st_mode) for d in ("run", "run/conf")] == [
        0o700,
        0o700,
    ]
    planted = f"{tmp_path}/run/conf/.token.2.tmp"
    os.symlink(f"{tmp_path}/neighbour", planted)
    with pytest.raises(OSError):
        sftp.write_temp(real_sftp, planted, b"secret", 0o600)
    assert not (tmp_path / "neighbour").exists()
