"""The deployment service's way to a plan's hosts (`transports(plan)`, shared by its mixins),
and what it does there for a client on a cluster host (`kvpd bench` with bench.host): a folder
in a run dir, a command run to completion, a file read back."""

from __future__ import annotations

import posixpath

from kvpd.errors import DeployError
from kvpd.exec.pool import TransportPool
from kvpd.exec.transport import CommandResult
from kvpd.plan.value import Plan


class PlanTransports:
    """The service's one way to a plan's hosts. Mixed into Deployments (through Inspecting and
    Leasing), which provides the transport pool."""

    _pool: TransportPool

    def transports(self, plan: Plan) -> TransportPool:
        """The one way to `plan`'s hosts, their files and ports: the service's pool, told
        `plan`'s hosts (a transport opens on first use and closes with the service)."""
        return self._pool.for_plan(plan)


class ClientHosts(PlanTransports):
    """Mixed into Deployments, which provides the transport pool."""

    def host_dir(self, plan: Plan, host: str, *parts: str) -> str:
        """An absolute folder inside `host`'s run dir (created), for what a client writes."""
        t = self.transports(plan)[host]
        path = t.resolve(posixpath.join(plan.host(host).run_dir, *parts))
        r = t.run(["mkdir", "-p", "--", path], timeout_s=60)
        if not r.ok:
            raise DeployError(f"could not create {path} on {host}: {r.stderr.strip()}")
        return path

    def run_on(
        self, plan: Plan, host: str, argv: list[str], *, env: dict[str, str], timeout_s: float
    ) -> CommandResult:
        """Run a command to completion on `host` (a benchmark client), its output returned."""
        return self.transports(plan)[host].run(argv, env=env, timeout_s=timeout_s)

    def read_on(self, plan: Plan, host: str, path: str) -> bytes:
        """A file from `host` (a client's results); FileNotFoundError if it is not there."""
        return self.transports(plan)[host].read(path)
