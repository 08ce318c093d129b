"""The shared jump-host connections: one per chain while any host uses it, a new one once it
died, closed with the last user (the SSH part runs in tests/e2e/test_ssh_bastion.py)."""

from __future__ import annotations

import threading
from typing import Any

from kvpd.exec.ssh import jumps


class _Client:
    made = 0

    def __init__(self) -> None:
        _Client.made += 1
        self.closed = False

    def get_transport(self) -> Any:
        client = self

        class T:
            def is_active(self) -> bool:
                return not client.closed

        return T()

    def close(self) -> None:
        self.closed = True


def test_one_connection_per_chain_closed_with_its_last_user() -> None:
    key = ("bastion-chain", "kh", False)
    got: list[Any] = []

    def use() -> None:
        got.append(jumps.acquire(key, _Client))  # type: ignore[arg-type]

    threads = [threading.Thread(target=use) for _ in range(8)]
    before = _Client.made
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _Client.made - before == 1
    assert all(c is got[0] for c in got)
    for c in got[:-1]:
        jumps.release(key, c)
        assert not c.closed
    jumps.release(key, got[-1])
    assert got[0].closed
    again = jumps.acquire(key, _Client)  # type: ignore[arg-type]
    assert again is not got[0]
    again.close()  # died: the next user gets a new one
    fresh = jumps.acquire(key, _Client)  # type: ignore[arg-type]
    assert fresh is not again
    assert not fresh.closed
    jumps.release(key, again)
    jumps.release(key, fresh)
    assert fresh.closed
