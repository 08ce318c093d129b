"""One preflight check's outcome: what preflight and the bundle's preflight both return."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """A read-only check on one host (`*`: across hosts), with a fix when it failed."""

    host: str
    name: str
    ok: bool
    detail: str
    fix: str = ""

    @classmethod
    def judged(cls, host: str, name: str, ok: bool, passed: str, failed: str, fix: str) -> Check:
        """A check whose detail reads `passed` or `failed`, with `fix` only when it failed."""
        return cls(host, name, ok, passed if ok else failed, "" if ok else fix)
