"""`kvpd diagnose`: gather what explains a deployment's state from every host, in parallel.

Read-only on the hosts. Works from whatever the state file holds, so a half-started
deployment, a crashed one and one whose `up` was killed half way are all covered (processes
never started simply have no log). Secrets are masked (diagnose.redact): environment values
unless their name is known safe, and secret shapes in every text. `shareable=True` builds an
archive meant for others: masked log tails and the summary, host facts without sockets, disks
or kernel log, and no state, environments, rendered files or events; host addresses, run dirs
and key paths replaced by placeholders. The archive is created 0600.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kvpd.exec.diagnose import causes as diagnose
from kvpd.exec.diagnose import redact
from kvpd.exec.fanout import Fanout
from kvpd.exec.local import private_dirs
from kvpd.exec.pool import TransportPool
from kvpd.exec.processes import supervised
from kvpd.exec.processes.health import probe
from kvpd.exec.processes.stop import is_running
from kvpd.exec.state import DeploymentState, ProcessRecord

# One script per host; every value reaches it as a positional parameter, never as code.
_HOST_FACTS_SH = r"""
section() { printf '\n===== %s =====\n' "$1"; }
section uname; uname -a
section uptime; uptime
section memory; free -m 2>&1 || cat /proc/meminfo
section disk; df -h -- "$1" /dev/shm /tmp 2>&1
section listening; (ss -ltnp 2>/dev/null || ss -ltn 2>&1 || netstat -ltn 2>&1)
if command -v npu-smi >/dev/null 2>&1; then section npu-smi; npu-smi info 2>&1; fi
if command -v nvidia-smi >/dev/null 2>&1; then section nvidia-smi; nvidia-smi 2>&1; fi
section kernel-log; (dmesg 2>/dev/null | tail -n 50) || echo "(not readable)"
shift
for py in "$@"; do
  case "$py" in
    @*) py="$(dirname -- "$(command -v -- "${py#@}" || echo /none/x)")/python";;
  esac
  section "packages of $py"
  "$py" -c 'import importlib.metadata as m
for n in ("vllm", "vllm-ascend", "vllm_ascend", "torch", "torch-npu", "torch_npu",
          "transformers", "kvpd", "mooncake-transfer-engine", "ucm"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        pass' 2>&1
done
"""
_VERSION_PACKAGES = ("vllm", "vllm-ascend", "torch", "torch-npu", "transformers")
Finding = Literal["running", "healthy", "unhealthy", "exited", "never started", "unknown"]
_ALIVE: dict[bool | None, Finding] = {True: "healthy", False: "unhealthy", None: "running"}


@dataclass
class ProcessFinding:
    name: str
    host: str
    state: Finding
    cause: str = ""


@dataclass
class Report:
    deployment: str
    archive: Path
    processes: list[ProcessFinding] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # across hosts (version mismatch, ...)


def _host_facts(pool: TransportPool, host: str, run_dir: str, pythons: list[str]) -> str:
    r = pool[host].run(["bash", "-c", _HOST_FACTS_SH, "kvpd-diagnose", run_dir, *pythons],
                       timeout_s=60)  # fmt: skip
    return r.stdout + (f"\n(stderr)\n{r.stderr}" if r.stderr.strip() else "")


def _pythons(state: DeploymentState, host: str) -> list[str]:
    req = state.plan.requirements.get(host)
    out = []
    for need in req.packages if req else ():
        key = need.python.key()  # a path, or "@command": the python next to that command
        if key not in out:
            out.append(key)
    return out or ["python3"]


def _process(pool: TransportPool, state: DeploymentState, rec: ProcessRecord, lines: int
             ) -> tuple[ProcessFinding, dict[str, str]]:  # fmt: skip
    t = pool[rec.host]
    files: dict[str, str] = {}
    r = t.run(["tail", "-n", str(lines), rec.log], timeout_s=30)
    log = r.stdout if r.ok else f"(cannot read {rec.log}: {r.stderr.strip()})"
    files["log.txt"] = redact.scrub(log)
    alive = is_running(t, rec)
    env = t.run(["cat", f"/proc/{rec.pid}/environ"], timeout_s=15) if alive else None
    if env is not None and env.ok:
        files["env.txt"] = redact.env_text(env.stdout)
    sup = supervised.read(t, state.run_dirs.get(rec.host, ""), rec.name, rec.pid)
    spec = next((p for p in state.plan.processes if p.name == rec.name), None)
    healthy, probed = None, ""
    if alive and spec is not None and spec.health is not None:
        pr = probe(t, spec.health, timeout_s=3)
        healthy, probed = pr.ok, pr.detail
    st: Finding = "exited" if not alive else _ALIVE[healthy]  # the health check's answer
    files["state.txt"] = json.dumps({"pid": rec.pid, "pgid": rec.pgid, "alive": alive,
                                     "healthy": healthy, "recorded": rec.status,
                                     "supervisor": sup.__dict__ if sup else None},
                                    indent=1)  # fmt: skip
    cause = ""
    if st in ("exited", "unhealthy"):
        ports = spec.ports if spec else tuple(rec.ports)
        cause = diagnose.likely_cause(diagnose.current_run(log), name=rec.name,
                                      host=rec.host, ports=ports)  # fmt: skip
        if not cause and st == "unhealthy":
            cause = (
                f"alive but its health check fails ({probed}): still loading, or stuck past "
                "its health timeout; see its log."
            )
        if not cause:
            cause = "exited; no known pattern in its log (see log.txt in the archive)."
    return ProcessFinding(rec.name, rec.host, st, cause), files


def _versions(facts: dict[str, str]) -> list[str]:
    """Packages whose versions differ across hosts."""
    seen: dict[str, dict[str, str]] = {}
    for host, text in facts.items():
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in _VERSION_PACKAGES:
                seen.setdefault(parts[0], {})[host] = parts[1]
    return [
        f"version mismatch across hosts: {pkg} " + ", ".join(f"{v} on {h}" for h, v in vs.items())
        for pkg, vs in sorted(seen.items())
        if len(set(vs.values())) > 1
    ]


SHAREABLE_SECTIONS = ("uname", "uptime", "memory", "npu-smi", "nvidia-smi", "packages of")
SHAREABLE_LOG_LINES = 50
SHAREABLE_FILES = ("log.txt", "state.txt")


def _shareable_facts(text: str) -> str:
    """Only the sections that describe the machine, not its sockets, disks or kernel log."""
    keep, out = False, []
    for line in text.splitlines():
        if line.startswith("===== ") and line.endswith(" ====="):
            keep = line[6:-6].startswith(SHAREABLE_SECTIONS)
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def _placeholders(state: DeploymentState) -> list[tuple[str, str]]:
    """Topology strings of the plan and what a shareable archive says instead (longest first,
    so a path is replaced before an address it contains)."""
    pairs = {d: f"<run dir of {h}>" for h, d in state.run_dirs.items() if d}
    for h in state.plan.hosts:
        pairs |= {h.run_dir: f"<run dir of {h.name}>", h.address: f"<address of {h.name}>"}
        paths = (("key", h.key), ("known_hosts", h.known_hosts), ("jump", h.jump))
        pairs |= {v: f"<{k} of {h.name}>" for k, v in paths if v}
    return sorted(pairs.items(), key=lambda kv: -len(kv[0]))


def _shareable(members: dict[str, bytes], state: DeploymentState) -> dict[str, bytes]:
    subs = _placeholders(state)

    def anon(data: bytes) -> bytes:
        text = data.decode(errors="replace")
        for real, shown in subs:
            text = text.replace(real, shown)
        return text.encode()

    out = {}
    for name, data in members.items():
        if name == "summary.txt" or name.endswith(SHAREABLE_FILES):
            if name.endswith("log.txt"):
                data = b"\n".join(data.splitlines()[-SHAREABLE_LOG_LINES:]) + b"\n"
            out[name] = anon(data)
        elif name.endswith("facts.txt"):
            out[name] = anon(_shareable_facts(data.decode(errors="replace")).encode())
    return out


def _collect(
    pool: TransportPool, state: DeploymentState, hosts: list[str], lines: int
) -> tuple[dict[str, str], list[tuple[ProcessFinding, dict[str, str]]]]:
    """Every host's facts and every process's finding and files, in parallel."""
    plan = state.plan

    def host_job(h: str) -> tuple[str, str]:
        run_dir = state.run_dirs.get(h) or plan.host(h).run_dir
        try:
            return h, _host_facts(pool, h, run_dir, _pythons(state, h))
        except Exception as e:  # noqa: BLE001 - one unreachable host must not hide the others
            return h, f"(host unreachable: {e})"

    def proc_job(rec: ProcessRecord) -> tuple[ProcessFinding, dict[str, str]]:
        try:
            return _process(pool, state, rec, lines)
        except Exception as e:  # noqa: BLE001 - as above
            return ProcessFinding(rec.name, rec.host, "unknown", f"host unreachable: {e}"), {}

    with Fanout(16) as fan:
        facts = dict(fan.map(host_job, hosts))
        found = fan.map(proc_job, list(state.processes))
    return facts, found


def gather(pool: TransportPool, state: DeploymentState, out_dir: Path, *, lines: int = 200,
           extra: dict[str, bytes] | None = None, shareable: bool = False) -> Report:  # fmt: skip
    """Collect everything into `out_dir/<time>.tar.gz`; the report names a cause per process."""
    plan = state.plan
    pool = pool.for_plan(plan)  # the hosts of an older state too
    members: dict[str, bytes] = dict(extra or {})
    members["state.json"] = redact.scrub(json.dumps(state.to_dict(), indent=1)).encode()
    for f in plan.files:  # masked by name in `state` already; by shape here
        members[f"files/{f.host}/{f.path}"] = redact.scrub(f.content).encode()
    hosts = sorted({h.name for h in plan.hosts})

    facts, found = _collect(pool, state, hosts, lines)
    report = Report(state.deployment, Path())
    for h, text in facts.items():
        members[f"hosts/{h}/facts.txt"] = redact.scrub(text).encode()
    for finding, files in found:
        report.processes.append(finding)
        for fname, text in files.items():
            members[f"processes/{finding.name}/{fname}"] = text.encode()
    started = {r.name for r in state.processes}
    for p in plan.processes:
        if p.name not in started:
            why = f"`up` stopped before stage {p.stage}"
            report.processes.append(ProcessFinding(p.name, p.host, "never started", why))
    report.problems = _versions(facts)
    summary = [f"{f.name} on {f.host}: {f.state}" + (f" — {f.cause}" if f.cause else "")
               for f in report.processes] + report.problems  # fmt: skip
    members["summary.txt"] = redact.scrub("\n".join(summary) + "\n").encode()
    if shareable:
        members = _shareable(members, state)
    private_dirs(out_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report.archive = out_dir / f"{stamp}{'-shareable' if shareable else ''}.tar.gz"
    _write_archive(report.archive, f"{state.deployment}-{stamp}", members)
    return report


def _write_archive(path: Path, top: str, members: dict[str, bytes]) -> None:
    """A new gzip'd tar, 0600 from its creation (never an existing file or a symlink)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(posixpath.join(top, name))
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(data))
