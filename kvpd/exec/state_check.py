"""The state file is input, not code: who may have written it, and every field it gives.

`kvpd down`, `status`, `logs`, `restart` and `diagnose` act on what state.json says: PIDs to
signal, hosts to connect to, dirs to purge, URLs the admin token is sent to. So, as ssh does
with its own files, a state root, deployment dir or state file that another user owns or may
write is refused, and every loaded field is checked against the plan the same file records
(records on planned hosts, PIDs > 1, paths under the run dir, URLs on planned hosts and ports).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, get_args
from urllib.parse import urlsplit

from kvpd.errors import StateError
from kvpd.exec import logs
from kvpd.exec.records.model import DeploymentStatus, ProcessStatusWord
from kvpd.profile.container_schema import CONTAINER_NAME, ContainerRuntime
from kvpd.profile.types import shared_folder

if TYPE_CHECKING:
    from kvpd.exec.state import DeploymentState, ProcessRecord
    from kvpd.plan.value import ProcessSpec

STATES = get_args(DeploymentStatus)
RECORD_STATES = get_args(ProcessStatusWord)


def check_owner(path: Path, what: str) -> None:
    """StateError unless `path` (not followed if a symlink) is owned by this user and not
    writable by group or others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    why = ""
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link"
    elif st.st_uid != os.getuid():
        why = f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        why = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    if why:
        fix = "chmod go-w" if "writable" in why else "replace it with one of your own"
        raise StateError(
            f"{path}: the {what} {why}, so another user could have written what kvpd would "
            f"act on (PIDs to signal, dirs to purge, hosts and URLs). Fix: {fix} {path} after "
            "checking its content, or point KVPD_STATE_DIR at a directory of your own."
        )


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _under(path: object, root: str) -> bool:
    if not isinstance(path, str) or not posixpath.isabs(path) or ".." in path.split("/"):
        return False
    return posixpath.normpath(path).startswith(root.rstrip("/") + "/")


def _planned_run_dir(resolved: str, planned: str) -> bool:
    """`resolved` is what a transport makes of the plan's run dir: the same absolute path, or
    a relative one (`~/` included) under some login directory."""
    rel = planned[2:] if planned.startswith("~/") else planned
    norm = posixpath.normpath(rel)
    if posixpath.isabs(norm):
        return resolved == norm
    return resolved.endswith("/" + norm)


def _record_problems(state: DeploymentState, r: ProcessRecord) -> list[str]:
    where = f"processes[{r.name!r}]"
    try:
        spec = state.plan.process(r.name)
    except (KeyError, TypeError):
        return [f"{where}: no process of that name in the plan"]
    out = []
    if r.host != spec.host:
        out.append(f"{where}.host: {r.host!r}, but the plan runs it on {spec.host!r}")
    for field in ("pid", "pgid"):
        v = getattr(r, field)
        if not _int(v) or v <= 1:
            out.append(f"{where}.{field}: {v!r} is not a process number kvpd started (> 1)")
    if _int(r.pid) and r.pid != r.pgid:
        out.append(f"{where}.pgid: {r.pgid!r} differs from pid {r.pid!r} (kvpd starts groups)")
    if not _int(r.start_ticks) or r.start_ticks < 0:
        out.append(f"{where}.start_ticks: {r.start_ticks!r} is not a start time")
    if not isinstance(r.ports, list) or not set(r.ports) <= set(spec.ports):
        out.append(f"{where}.ports: {r.ports!r} are not the planned ports {list(spec.ports)}")
    return out + _record_place_problems(state, r, spec, where)


def _record_place_problems(
    state: DeploymentState, r: ProcessRecord, spec: ProcessSpec, where: str
) -> list[str]:
    """The record's log, stage and status against its planned process."""
    out = []
    run_dir = state.run_dirs.get(r.host, "")
    if not run_dir or r.log != logs.log_path(run_dir, spec):
        out.append(f"{where}.log: {r.log!r} is not its planned log under the run dir")
    if not isinstance(r.stage, int) or r.stage != spec.stage:
        out.append(f"{where}.stage: {r.stage!r}, but the plan says {spec.stage}")
    if r.status not in RECORD_STATES:
        out.append(f"{where}.status: {r.status!r} is not one of {', '.join(RECORD_STATES)}")
    return out


def _url_problems(state: DeploymentState) -> list[str]:
    plan = state.plan
    addresses = {h.address for h in plan.hosts} | {"127.0.0.1", "localhost", "::1"}
    ports = {u.port for u in plan.ports} | {q for p in plan.processes for q in p.ports}
    urls = [("proxy_url", plan.proxy_url)] + [
        (f"processes[{p.name!r}].health.url", p.health.url) for p in plan.processes if p.health
    ]
    out = []
    for where, url in urls:
        if not url:
            continue
        try:
            u = urlsplit(url)
            ok = u.scheme in ("http", "https") and u.hostname in addresses and u.port in ports
        except ValueError:
            ok = False
        if not ok:
            out.append(f"plan.{where}: {url!r} is not on a planned host and port")
    return out


def problems(state: DeploymentState, deployment: str) -> list[str]:
    """What is wrong with a loaded state (empty when it can be acted on)."""
    out = []
    if state.deployment != deployment or state.plan.deployment != deployment:
        out.append(f"deployment: {state.deployment!r} is not the deployment of its directory")
    if state.status not in STATES:
        out.append(f"status: {state.status!r} is not one of {', '.join(STATES)}")
    out += _run_dir_problems(state)
    out += _container_problems(state)
    for r in state.processes:
        out += _record_problems(state, r)
    out += _planned_process_problems(state)
    return out + _url_problems(state)


def _run_dir_problems(state: DeploymentState) -> list[str]:
    out = []
    hosts = {h.name for h in state.plan.hosts}
    for host, run_dir in state.run_dirs.items():
        if host not in hosts:
            out.append(f"run_dirs[{host!r}]: not a host of the plan")
        elif not _under(run_dir + "/x", "/") or shared_folder(run_dir):
            out.append(
                f"run_dirs[{host!r}]: {run_dir!r} is not an absolute dedicated folder without '..'"
            )
        elif not _planned_run_dir(run_dir, state.plan.host(host).run_dir):
            planned = state.plan.host(host).run_dir
            out.append(f"run_dirs[{host!r}]: {run_dir!r} is not the plan's run dir {planned!r}")
    return out


def _container_problems(state: DeploymentState) -> list[str]:
    out = []
    for h in state.plan.hosts:
        c = h.container
        if c is not None and (
            not re.fullmatch(CONTAINER_NAME, c.name) or c.runtime not in get_args(ContainerRuntime)
        ):
            out.append(
                f"plan.hosts[{h.name!r}].container: {c.runtime!r} {c.name!r} is not a runtime "
                "and container name a profile can give"
            )
    return out


def _planned_process_problems(state: DeploymentState) -> list[str]:
    out = []
    hosts = {h.name for h in state.plan.hosts}
    for p in state.plan.processes:
        if p.host not in hosts:
            out.append(f"plan.processes[{p.name!r}].host: {p.host!r} is not a host of the plan")
        if posixpath.isabs(p.script) or ".." in p.script.split("/"):
            out.append(f"plan.processes[{p.name!r}].script: {p.script!r} is not under the run dir")
    return out


def check(state: DeploymentState, deployment: str, path: Path) -> DeploymentState:
    """`state`, or StateError listing what is wrong with it (see `problems`)."""
    try:
        found = problems(state, deployment)
    except (TypeError, AttributeError, ValueError) as e:  # a value of the wrong type
        found = [f"a field has a value of the wrong type ({e})"]
    if found:
        raise StateError(
            f"{path}: the state file does not describe what kvpd started "
            f"({len(found)} problems), so kvpd will not act on it:\n"
            + "\n".join(f"  - {p}" for p in found[:20])
            + f"\nFix: if nothing of deployment {deployment!r} runs any more, delete the file; "
            "otherwise restore it from what `kvpd up` wrote."
        )
    return state
