"""Finding, on a host, the sessions kvpd started for a deployment that no record names.

A start is recorded once the host has reported the new PID. An `up` killed in between (SIGKILL,
a lost controller), or a start whose answer timed out after the process had begun, leaves a
process that no record names and no `down` would stop. Every process kvpd starts has
`KVPD_DEPLOYMENT=<deployment>` in its environment and its run dir as working directory; the
kernel holds both from the exec on, and the process's children inherit them. After the
recorded processes are stopped, `down` and a failed `up`'s rollback list the processes on each
host that still carry both, and stop their sessions with the same guarded group signals: kvpd
starts each process in a session of its own (setsid), so a group of ours has sid == pgid, and
the start time used as the PID-reuse guard is read in the same listing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvpd.exec import procfs
from kvpd.exec.processes.stop import Stopper, StopResult
from kvpd.exec.state import DeploymentState, ProcessRecord
from kvpd.exec.transport import Transport, Transports

PoolMap = Callable[[Callable[[str], Any], Iterable[str]], list[Any]]

DEPLOYMENT_ENV = "KVPD_DEPLOYMENT"
PROCESS_ENV = "KVPD_PROCESS"

# $1 the environment entry (KVPD_DEPLOYMENT=<name>), $2 the run dir. One line per process whose
# environment has that entry and whose working directory is the run dir or below it: its
# KVPD_PROCESS value, a tab, its stat line. grep -z reads NUL-separated entries, -x whole ones;
# one grep lists every candidate, so the cost is a process per match, not per PID.
SWEEP_SH = r"""want=$1
dir=$(cd -- "$2" 2>/dev/null && pwd -P) || exit 0
for e in $(grep -lsxzF -e "$want" /proc/[0-9]*/environ 2>/dev/null); do
  d=${e%/environ}
  c=$(readlink -- "$d/cwd" 2>/dev/null) || continue
  case $c in "$dir" | "$dir"/*) ;; *) continue ;; esac
  s=$(cat -- "$d/stat" 2>/dev/null) || continue
  n=$(grep -azm1 -e '^KVPD_PROCESS=' -- "$e" 2>/dev/null | tr -d '\000\n\t')
  printf '%s\t%s\n' "${n#KVPD_PROCESS=}" "$s"
done
exit 0
"""

# What a KVPD_PROCESS value may be before it names anything in a message (host output).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Marked:
    """A process that carries the deployment's marks: its KVPD_PROCESS value and stat."""

    name: str
    stat: procfs.ProcStat


def parse_listing(out: str) -> list[Marked]:
    """SWEEP_SH's output; lines that do not parse (the host's words) are dropped."""
    found = []
    for line in out.splitlines():
        name, tab, raw = line.partition("\t")
        st = procfs.parse_stat(raw) if tab else None
        if st is None:
            continue
        found.append(Marked(name if _NAME.fullmatch(name) else "?", st))
    return found


def list_marked(t: Transport, deployment: str, run_dir: str) -> list[Marked]:
    """The live processes on `t`'s host that carry `deployment`'s marks under `run_dir`."""
    r = t.run(["sh", "-c", SWEEP_SH, "kvpd-sweep", f"{DEPLOYMENT_ENV}={deployment}", run_dir],
              timeout_s=30)  # fmt: skip
    if not r.ok:
        raise OSError(f"listing the processes of {run_dir}: {r.stderr.strip()[-300:]}")
    return [m for m in parse_listing(r.stdout) if not m.stat.gone]


def unrecorded(
    host: str, marked: list[Marked], known_groups: set[int], stage: int
) -> list[ProcessRecord]:
    """A record for each session among `marked` that is not in `known_groups` (those the
    records name): the session's leader if it lives, else the group its remaining members keep
    (the leader's start time is then the earliest of theirs, which procfs.may_signal_group
    checks them all against). A process outside a session of its own is not one kvpd started
    and is left alone."""
    groups: dict[int, list[Marked]] = {}
    for m in marked:
        if m.stat.sid == m.stat.pgid and procfs.signalable(m.stat.pgid):
            groups.setdefault(m.stat.pgid, []).append(m)
    records = []
    for pgid, members in sorted(groups.items()):
        if pgid in known_groups:
            continue
        leader = next((m for m in members if m.stat.pid == pgid), None)
        first = leader or min(members, key=lambda m: m.stat.start_ticks)
        records.append(
            ProcessRecord(
                name=f"{first.name} (unrecorded)",
                host=host,
                stage=stage,
                pid=pgid,
                pgid=pgid,
                start_ticks=first.stat.start_ticks,
                ports=[],
                log="",
                started_at=0.0,
            )
        )
    return records


def stop_unrecorded(stopper: Stopper, state: DeploymentState, result: StopResult) -> None:
    """Stop the sessions of `state`'s deployment that no record names, adding their outcomes
    to `result` (the recorded processes' stop)."""
    found, problems = find_unrecorded(stopper.transports, stopper.pool.map, state)
    for problem in problems:
        stopper.reporter.message(problem)
    for r in found:
        stopper.reporter.message(
            f"{r.host}: process group {r.pgid} ({r.name}) runs in this deployment's run dir "
            "with its environment, but no record names it: stopping it"
        )
    if found:
        result.outcomes.extend(stopper.stop(found).outcomes)


def find_unrecorded(
    transports: Transports, pmap: PoolMap, state: DeploymentState
) -> tuple[list[ProcessRecord], list[str]]:
    """Every host's unrecorded sessions of `state`'s deployment (in its run dir there), and a
    message for each host that could not be asked (its sessions stay unknown, not stopped)."""
    stage = max((r.stage for r in state.processes), default=0) + 1  # stopped after the rest

    def one(host: str) -> tuple[list[ProcessRecord], str]:
        known = {r.pgid for r in state.processes if r.host == host}
        try:
            marked = list_marked(transports[host], state.deployment, state.run_dirs[host])
        except Exception as e:  # noqa: BLE001 - one host's failure must not stop the others
            return [], f"{host}: could not look for processes no record names: {e}"
        return unrecorded(host, marked, known, stage), ""

    answers = pmap(one, sorted(state.run_dirs))
    return [r for rs, _ in answers for r in rs], [msg for _, msg in answers if msg]
