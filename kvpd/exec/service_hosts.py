"""What the deployment service does for a client on a cluster host (`kvpd bench` with
bench.host): a folder in a run dir, a command run to completion, a file read back."""

from __future__ import annotations

import posixpath

from kvpd.errors import DeployError
from kvpd.exec.pool import TransportPool
from kvpd.exec.transport import CommandResult
from kvpd.plan.value import Plan


class ClientHosts:
    """Mixed into Deployments, which provides the transport pool."""

    _pool: TransportPool

    def host_dir(self, plan: Plan, host: str, *parts: str) -> str:
        """An absolute folder inside `host`'s run dir (created), for what a client writes."""
        self._pool.add_hosts(plan.hosts)
        t = self._pool[host]
        path = t.resolve(posixpath.join(plan.host(host).run_dir, *parts))
        r = t.run(["mkdir", "-p", "--", path], timeout_s=60)
        if not r.ok:
            raise DeployError(f"could not create {path} on {host}: {r.stderr.strip()}")
        return path

    def run_on(
        self, plan: Plan, host: str, argv: list[str], *, env: dict[str, str], timeout_s: float
    ) -> CommandResult:
        """Run a command to completion on `host` (a benchmark client), its output returned."""
        self._pool.add_hosts(plan.hosts)
        return self._pool[host].run(argv, env=env, timeout_s=timeout_s)

    def read_on(self, plan: Plan, host: str, path: str) -> bytes:
        """A file from `host` (a client's results); FileNotFoundError if it is not there."""
        self._pool.add_hosts(plan.hosts)
        return self._pool[host].read(path)
