"""The transport for a host whose processes run inside a container.

`ContainerTransport` wraps the host's own transport (SSH or local) and runs every command
through the runtime's `exec` (`docker exec NAME sh -c LINE`): the same quoted command lines
the SSH transport sends (kvpd.exec.ssh.commands), one level deeper, so a plan value is still
one word inside. Files go through the host: the run dir is mounted at the same path inside and
outside, so what is written over SFTP is where the processes look (preflight proves it).
PIDs, process groups and start times are those seen inside the container (its PID namespace),
and every later operation reads them inside again, so the PID-reuse guard holds.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from kvpd.errors import TransportError
from kvpd.exec.ssh import commands
from kvpd.exec.ssh.processes import ShellProcesses, started, started_pid
from kvpd.exec.transport import (
    CommandResult,
    HttpRequest,
    HttpResponse,
    Run,
    RunOptions,
    Started,
    Streams,
    Transport,
)

if TYPE_CHECKING:  # annotations only (typing.Unpack is 3.11+)
    from typing_extensions import Unpack
from kvpd.plan.container import ContainerSpec

# What the runtime prints when it cannot do the exec itself, and what the user should do.
_RUNTIME_FAILURES = (
    (
        "permission denied",
        "the login user cannot reach the runtime's socket. Fix: run podman rootless as that "
        "user, or add the user to the `docker` group and log in again (membership of that "
        "group is root-equivalent on the host: give it only to a user you would give root).",
    ),
    (
        "no such container",
        "the container does not exist. Fix: start it (the `run` line "
        "`kvpd plan` shows) or give `image` so kvpd starts it.",
    ),
    ("is not running", "the container is stopped. Fix: `{runtime} start {name}`."),
)
RUNTIME_MISSING = (
    "the runtime is not installed on the host ({runtime} not found). Fix: install it or set "
    "container.command to its path."
)


def runtime_failure(spec: ContainerSpec, host: str, r: CommandResult) -> str | None:
    """An actionable sentence when `r` failed in the runtime (not in the command inside)."""
    text = (r.stderr + r.stdout).lower()
    head = f"host {host}: container {spec.name!r} ({spec.runtime}): "
    # The host's shell (or exec) names the runtime's program when that is what is missing; a
    # command missing inside names itself.
    if r.exit_code == commands.NOT_FOUND and spec.command.lower() in text:
        return head + RUNTIME_MISSING.format(runtime=spec.command)
    for needle, advice in _RUNTIME_FAILURES:
        if needle in text:
            return head + advice.format(runtime=spec.command, name=spec.name)
    return None


class ContainerTransport(ShellProcesses):
    """Operations on one host's container, through `inner` (the host's transport)."""

    def __init__(self, inner: Transport, spec: ContainerSpec) -> None:
        self.inner = inner
        self.spec = spec
        self.host = inner.host

    def __repr__(self) -> str:
        return f"ContainerTransport({self.spec.runtime} {self.spec.name} on {self.inner!r})"

    def _inside(
        self,
        line: str,
        timeout_s: float,
        secret: dict[str, str] | None = None,
        idempotent: bool = False,
    ) -> CommandResult:
        """Run `line` inside. `secret` variables reach the runtime's exec through the host
        transport's environment (`-e NAME` passes a variable on by name), never through its
        command line (`ps` on the host)."""
        argv = self.spec.exec_argv(["sh", "-c", line], pass_env=sorted(secret or ()))
        return self.inner.run(argv, timeout_s=timeout_s, env=secret or None, idempotent=idempotent)

    def _snippet(
        self, script: str, what: str, timeout_s: float = 30.0, *, idempotent: bool = False
    ) -> str:
        r = self._inside(script, timeout_s, idempotent=idempotent)
        if not r.ok:
            why = runtime_failure(self.spec, self.host, r)
            raise TransportError(
                why
                or f"host {self.host}, container {self.spec.name}: {what} failed "
                f"(exit {r.exit_code}): {r.stderr.strip()[-500:]}"
            )
        return r.stdout

    # -- commands and files ------------------------------------------------------------

    def run(self, argv: list[str], **opts: Unpack[RunOptions]) -> CommandResult:
        o = Run(**opts)
        where = self.resolve(o.cwd) if o.cwd is not None else None
        secret, env = commands.split_secret_env(o.env)
        line = commands.command_line(list(argv), env=env, cwd=where)
        r = self._inside(line, o.timeout_s, secret, o.idempotent)
        return CommandResult(tuple(argv), r.exit_code, r.stdout, r.stderr)

    def put(self, path: str, content: bytes, *, mode: int = 0o644) -> None:
        self.inner.put(path, content, mode=mode)  # same path inside (mounted run dir)

    def read(self, path: str) -> bytes:
        return self.inner.read(path)

    def append(self, path: str, text: str) -> None:
        # Inside, unlike put: a file created by the host's user with mode 0600 could not be
        # appended to by the container's user (the process started inside writes its log).
        target = self.resolve(path)
        r = self.run(commands.append_argv(target, text), timeout_s=30)
        if not r.ok:
            raise TransportError(
                f"host {self.host}, container {self.spec.name}: cannot append to {target}: "
                f"{r.stderr.strip()}"
            )

    def http(self, request: HttpRequest) -> HttpResponse:
        return self.inner.http(request)  # the container shares the host's network

    def open_stream(self, address: str, port: int, *, timeout_s: float = 10.0) -> Any:
        if not isinstance(self.inner, Streams):
            raise TransportError(f"host {self.host}: its transport carries no streams")
        return self.inner.open_stream(address, port, timeout_s=timeout_s)

    def resolve(self, path: str) -> str:
        # Relative paths mean the host's login directory, as for files: one meaning for both.
        return posixpath.normpath(self.inner.resolve(path))

    # -- processes (as seen inside the container) --------------------------------------

    def start_detached(
        self, argv: list[str], *, log: str, cwd: str, env: dict[str, str] | None = None
    ) -> Started:
        log_path, cwd_path = self.resolve(log), self.resolve(cwd)
        secret, rest = commands.split_secret_env(env)
        line = commands.detached_command_line(list(argv), log=log_path, cwd=cwd_path, env=rest)
        r = self._inside(line, 30.0, secret)
        lines = r.stdout.splitlines()
        # The PID and the process's own stat line come in either order (processes.started).
        if not r.ok or started_pid(lines) is None:
            why = runtime_failure(self.spec, self.host, r)
            raise TransportError(
                why
                or f"host {self.host}, container {self.spec.name}: starting {argv[0]!r} in "
                f"{cwd_path} failed (exit {r.exit_code}): "
                f"{(r.stderr.strip() or r.stdout.strip())[-500:]}. Fix: check that the run "
                "dir is mounted at the same path inside and the command exists there."
            )
        return started(lines, log_path)

    def close(self) -> None:
        self.inner.close()
