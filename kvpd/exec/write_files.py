"""Writing a plan's rendered files into each host's run dir (and emptying its fresh dirs)."""

from __future__ import annotations

import posixpath

from kvpd.errors import DeployError, KvpdError
from kvpd.exec.fanout import Fanout
from kvpd.exec.report import Reporter
from kvpd.exec.state import DeploymentState
from kvpd.exec.transport import Transport, Transports
from kvpd.plan.value import FileSpec


def write_files(
    state: DeploymentState, transports: Transports, reporter: Reporter, pool: Fanout
) -> None:
    """Every file of the plan on its host, the hosts in parallel; DeployError naming the file
    and host that failed."""
    by_host: dict[str, list[FileSpec]] = {}
    for f in state.plan.files:
        by_host.setdefault(f.host, []).append(f)

    def write(host: str) -> None:
        t, run_dir = transports[host], state.run_dirs[host]
        for d in state.plan.fresh_dirs:  # scratch, by the profile's say-so (relative only)
            _empty_dir(t, host, run_dir, d)
        reporter.message(f"{host}: writing {len(by_host[host])} files under {run_dir}")
        for f in by_host[host]:
            _put(t, host, run_dir, f)

    hosts = set(by_host) | (set(state.run_dirs) if state.plan.fresh_dirs else set())
    for h in hosts:
        by_host.setdefault(h, [])
    pool.map(write, sorted(hosts))


def _empty_dir(t: Transport, host: str, run_dir: str, d: str) -> None:
    """The fresh dir `d` (relative to the run dir, never outside it) emptied and made again."""
    path = posixpath.normpath(posixpath.join(run_dir, d))
    if not path.startswith(run_dir.rstrip("/") + "/"):
        raise DeployError(f"fresh dir {d!r} is outside the run dir {run_dir}")
    r = t.run(["rm", "-rf", "--", path], timeout_s=300)
    if r.ok:
        r = t.run(["mkdir", "-p", "--", path], timeout_s=60)
    if not r.ok:
        raise DeployError(f"emptying {path} on {host} failed: {r.stderr.strip()}")


def _put(t: Transport, host: str, run_dir: str, f: FileSpec) -> None:
    try:
        t.put(posixpath.join(run_dir, f.path), f.content.encode(), mode=f.mode)
    except KvpdError:
        raise
    except Exception as e:  # any transport failure, named with the file and host
        raise DeployError(f"writing {f.path} on host {host} failed: {e}") from e
