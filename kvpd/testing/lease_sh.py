"""The lease snippet (kvpd.exec.lease.host.LEASE_SH) on a FakeTransport: the same modes, exit
codes and output on the fake's file table, with the fake host's clock (`t.clock`) stamping the
mtime of every write, so tests can move a host's clock instead of sleeping through a lease."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from kvpd.exec.lease.host import CHANGED, MAX_READ
from kvpd.exec.transport import CommandResult

if TYPE_CHECKING:
    from kvpd.testing.transport import FakeTransport


def _version(content: bytes) -> str:
    return f"{zlib.crc32(content)} {len(content)}"  # stands for cksum: any stable digest


def run(t: FakeTransport, argv: list[str]) -> CommandResult:
    """sh -c LEASE_SH NAME MODE FILE WANT [NEW]."""
    mode, path, want = argv[4], t.resolve(argv[5]), argv[6]
    new = argv[7] if len(argv) > 7 else ""
    now = int(t.clock())
    content = t.files.get(path)
    cur = _version(content) if content is not None else ""
    if mode == "read":
        out = f"{now}\n"
        if content is not None:
            out += f"{t.mtimes.get(path, now)}\n{cur}\n" + content[:MAX_READ].decode(
                errors="replace"
            )
        return CommandResult(tuple(argv), 0, out, "")
    if cur != want:
        return CommandResult(tuple(argv), CHANGED, "", "")
    if mode == "drop":
        t.files.pop(path, None)
        return CommandResult(tuple(argv), 0, "", "")
    t.files[path], t.modes[path], t.mtimes[path] = new.encode(), 0o600, now
    return CommandResult(tuple(argv), 0, _version(new.encode()) + "\n", "")
