"""SFTP writes send the owner-only mode in the OPEN request itself (no window in which another
local user can read a token or a launch script), new-only, and make directories 0700."""

from __future__ import annotations

import paramiko
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


def test_the_temporary_file_is_created_owner_only_and_new(monkeypatch) -> None:  # noqa: ANN001
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
