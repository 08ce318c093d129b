"""A host record is input, not code: parsed strictly and checked against the plan built now.

What a host reports may have been written by anyone who can log in as the deployment's user,
or by an older kvpd, or be torn by a full disk. So a record is refused as a whole unless every
field has its type and bounds, it names the deployment and host asked for, its run dir is the
plan's, and each process is one the plan runs on that host, with its ports, devices, stage,
role and log path. A refused record is never acted on: nothing is signalled or read through it.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from typing import Any, get_args

from kvpd.errors import StateError
from kvpd.exec.logs import log_path
from kvpd.exec.records.model import (
    RECORD_FORMAT,
    HostRecord,
    ProcessStatusWord,
    RecordedProcess,
)
from kvpd.plan.value import Plan, ProcessSpec
from kvpd.profile.roles import Role
from kvpd.profile.types import shared_folder

MAX_RECORD_BYTES = 256 * 1024  # a 64-process host's record is ~30 KiB
PID_MAX = 1 << 22  # the kernel's largest pid_max
_WORD = re.compile(r"[\w.:@+-]{1,200}")
HOST_KEYS = {"format", "deployment", "host", "run_dir", "plan_digest", "started_by",
             "started_at", "kvpd_version", "updated_at", "processes"}  # fmt: skip
PROCESS_KEYS = set(RecordedProcess.__dataclass_fields__)


class RecordRefused(StateError):
    """A host record kvpd will not act on; `problems` says why, one line each."""

    def __init__(self, host: str, path: str, problems: list[str]) -> None:
        shown = "\n".join(f"  - {p}" for p in problems[:12])
        super().__init__(
            f"{host}: the host record {path} does not describe what kvpd started there "
            f"({len(problems)} problems), so kvpd will not act on it (nothing was signalled):"
            f"\n{shown}\nFix: if nothing of this deployment runs on {host} any more, remove "
            "the file; otherwise check who else writes to that run dir."
        )
        self.host = host
        self.problems = problems


def _int(v: object, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _time(v: object) -> bool:
    ok = isinstance(v, int | float) and not isinstance(v, bool)
    return ok and math.isfinite(float(v)) and 0 <= float(v) < 1e11  # type: ignore[arg-type]


def _word(v: object) -> bool:
    return isinstance(v, str) and bool(_WORD.fullmatch(v))


def planned_run_dir(resolved: str, planned: str) -> bool:
    """`resolved` is what a transport makes of the plan's run dir: the same absolute path, or
    a relative one (`~/` included) under some login directory. Never `..`, never a shared
    folder (`/`, `/tmp`, a home)."""
    if not posixpath.isabs(resolved) or ".." in resolved.split("/") or shared_folder(resolved):
        return False
    rel = planned[2:] if planned.startswith("~/") else planned
    norm = posixpath.normpath(rel)
    if posixpath.isabs(norm):
        return posixpath.normpath(resolved) == norm
    return posixpath.normpath(resolved).endswith("/" + norm)


def _ints(v: object, allowed: tuple[int, ...]) -> bool:
    if not isinstance(v, list) or len(v) > len(allowed):
        return False
    return all(_int(x, 0, 65535) for x in v) and set(v) <= set(allowed)


def _process_problems(p: Any, spec: ProcessSpec, run_dir: str) -> list[str]:
    w = f"processes[{spec.name!r}]"
    checks = (
        ("role", p.get("role") == str(spec.role), f"the plan's role is {spec.role}"),
        ("stage", p.get("stage") == spec.stage, f"the plan's stage is {spec.stage}"),
        ("pid", _int(p.get("pid"), 2, PID_MAX), "not a process number kvpd started (> 1)"),
        ("pgid", _int(p.get("pgid"), 2, PID_MAX) and p.get("pgid") == p.get("pid"),
         "not its own process group (kvpd starts each in a session of its own, pgid == pid > 1)"),
        ("start_ticks", _int(p.get("start_ticks"), 1, 1 << 62), "not a /proc start time"),
        ("ports", _ints(p.get("ports"), spec.ports), f"not the planned ports {list(spec.ports)}"),
        ("devices", _ints(p.get("devices"), spec.devices),
         f"not the planned devices {list(spec.devices)}"),
        ("log", p.get("log") == log_path(run_dir, spec), "not its planned log in the run dir"),
        ("started_at", _time(p.get("started_at")), "not a time"),
        ("launch_digest", _word(p.get("launch_digest")), "not a digest"),
        ("status", p.get("status") in get_args(ProcessStatusWord), "not a process status"),
    )  # fmt: skip
    return [f"{w}.{k}: {p.get(k)!r} is {why}" for k, ok, why in checks if not ok]


def _processes(raw: object, plan: Plan, host: str, run_dir: str) -> tuple[list[Any], list[str]]:
    specs = {p.name: p for p in plan.processes if p.host == host}
    if not isinstance(raw, list) or len(raw) > len(specs):
        return [], [f"processes: not a list of at most the {len(specs)} planned on {host}"]
    out, problems, seen = [], [], set()
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or set(p) != PROCESS_KEYS:
            problems.append(f"processes[{i}]: not a process entry (fields {sorted(PROCESS_KEYS)})")
            continue
        spec = specs.get(p["name"]) if isinstance(p["name"], str) else None
        if spec is None or p["name"] in seen:
            problems.append(f"processes[{i}].name: {p['name']!r} is not a process the plan "
                            f"runs on {host} (or is listed twice)")  # fmt: skip
            continue
        seen.add(spec.name)
        found = _process_problems(p, spec, run_dir)
        problems += found
        if not found:
            out.append(p)
    return out, problems


def _host_problems(d: dict[str, Any], plan: Plan, host: str) -> list[str]:
    checks = (
        ("format", d.get("format") == RECORD_FORMAT, f"not format {RECORD_FORMAT}"),
        ("deployment", d.get("deployment") == plan.deployment,
         f"another deployment's record, not {plan.deployment!r}'s"),
        ("host", d.get("host") == host, f"the record of another host, not {host!r}'s"),
        ("run_dir", isinstance(d.get("run_dir"), str)
         and planned_run_dir(d["run_dir"], plan.host(host).run_dir),
         f"not the plan's run dir {plan.host(host).run_dir!r}"),
        ("plan_digest", _word(d.get("plan_digest")), "not a digest"),
        ("started_by", _word(d.get("started_by")), "not user@host"),
        ("started_at", _time(d.get("started_at")), "not a time"),
        ("updated_at", _time(d.get("updated_at")), "not a time"),
        ("kvpd_version", _word(d.get("kvpd_version")), "not a version"),
    )  # fmt: skip
    out = [f"{k}: {d.get(k)!r} is {why}" for k, ok, why in checks if not ok]
    unknown = sorted(set(d) - HOST_KEYS)
    return out + ([f"unknown fields {unknown}"] if unknown else [])


def decode(raw: bytes) -> dict[str, Any] | str:
    """The record's JSON object, or why it is not one (size, encoding, syntax)."""
    if len(raw) > MAX_RECORD_BYTES:
        return f"{len(raw)} bytes, more than a record ever holds ({MAX_RECORD_BYTES})"
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return f"not JSON ({str(e)[:80]})"
    return d if isinstance(d, dict) else "not a JSON object"


def parse(raw: bytes, plan: Plan, host: str, path: str) -> HostRecord:
    """The record `host` holds for `plan`'s deployment; RecordRefused unless all of it is
    what kvpd writes for this plan (see the module docstring)."""
    d = decode(raw)
    if isinstance(d, str):
        raise RecordRefused(host, path, [d])
    problems = _host_problems(d, plan, host)
    procs: list[Any] = []
    if not problems:
        procs, problems = _processes(d.get("processes"), plan, host, d["run_dir"])
    if problems:
        raise RecordRefused(host, path, problems)
    fields = {k: v for k, v in d.items() if k not in ("format", "processes")}
    records = [RecordedProcess(**{**p, "role": Role(p["role"])}) for p in procs]
    return HostRecord(**fields, processes=records)
