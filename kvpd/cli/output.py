"""Rich rendering for up/down/status: live progress per process, results tables, JSON mirrors."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kvpd.cli.terminal import SafeConsole
from kvpd.exec.diagnose.gather import Report
from kvpd.exec.events import Event
from kvpd.exec.preflight.checks import Check
from kvpd.exec.processes.status import ProcessStatus
from kvpd.exec.processes.stop import DownResult
from kvpd.exec.report import Phase, Progress
from kvpd.exec.state import DeploymentState
from kvpd.plan.value import Plan

if TYPE_CHECKING:  # annotations only (typing.Unpack is 3.11+)
    from typing_extensions import Unpack

# Not a terminal (make demo, CI logs): wide enough that tables are not cut to 80 columns.
_WIDTH = None if Console().is_terminal else 160
# Node-sourced text is printed through these: escape sequences are removed (cli/terminal.py).
out = SafeConsole(highlight=False, soft_wrap=True, width=_WIDTH)
err = SafeConsole(stderr=True, highlight=False, width=_WIDTH)

_PHASE_STYLE = {
    "pending": "dim",
    "starting": "cyan",
    "waiting": "yellow",
    "initialising": "yellow",
    "healthy": "green",
    "failed": "bold red",
    "stopping": "magenta",
    "stopped": "dim",
}


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def plan_summary(plan: Plan) -> Table:
    t = Table(title=f"Deployment {plan.deployment} ({plan.profile_digest[:19]})")
    for col in ("Stage", "Process", "Host", "Role", "Ports", "Health"):
        t.add_column(col)
    for stage in plan.stages:
        for p in stage:
            t.add_row(
                str(p.stage),
                p.name,
                p.host,
                p.role,
                ",".join(map(str, p.ports)) or "-",
                p.health.url if p.health else "-",
            )
    return t


class LiveProgress:
    """A Reporter that shows one line per process; use as a context manager. Thread-safe."""

    def __init__(self, names: list[tuple[str, str]], title: str, console: Console = err) -> None:
        self._rows: dict[str, dict[str, Any]] = {
            n: {"host": h, "phase": "pending", "detail": "", "elapsed": None, "t": None}
            for n, h in names
        }
        self._messages: list[str] = []
        self._title = title
        self._lock = threading.Lock()
        self._console = console
        self._live = Live(self, console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(*exc)  # type: ignore[arg-type]
        if not self._console.is_terminal:  # Live leaves the last line open when not a tty
            self._console.line()

    def process(self, name: str, phase: Phase, **info: Unpack[Progress]) -> None:
        host, detail = info.get("host", ""), info.get("detail", "")
        with self._lock:
            row = self._rows.setdefault(name, {"host": host, "t": None})
            if phase == "starting":
                self._messages = []  # file writing is over: its note would only be stale
            if phase != row.get("phase"):
                row["t"] = time.monotonic()  # elapsed of the current phase, shown live
            row.update(phase=phase, detail=detail, elapsed=info.get("elapsed_s"))
            if host:
                row["host"] = host

    def message(self, text: str) -> None:
        with self._lock:
            self._messages = (self._messages + [text])[-3:]

    def __rich__(self) -> Table:
        with self._lock:
            caption = self._messages[-1] if self._messages else None
        t = Table(
            title=self._title,
            title_justify="left",
            caption=caption,
            caption_justify="left",
            box=None,
            padding=(0, 2),
        )
        for col in ("Process", "Host", "Status", "Elapsed", "Detail"):
            t.add_column(col)
        now = time.monotonic()
        with self._lock:
            for name, r in self._rows.items():
                phase = r.get("phase", "pending")
                elapsed = r.get("elapsed")
                if phase in ("starting", "waiting", "stopping") and r.get("t") is not None:
                    elapsed = now - r["t"] if elapsed is None else elapsed
                label = {"waiting": "waiting for health", "initialising": "still initialising"}
                label_text = label.get(phase, phase)
                t.add_row(
                    name,
                    r.get("host", ""),
                    Text(label_text, style=_PHASE_STYLE.get(phase, "")),
                    fmt_duration(elapsed) if elapsed is not None else "",
                    Text(str(r.get("detail", ""))[:120], style="dim"),
                )
        return t


def state_json(state: DeploymentState, path: str = "") -> dict[str, Any]:
    return {
        "deployment": state.deployment,
        "status": state.status,
        "profile_digest": state.profile_digest,
        "state_file": path,
        "proxy_url": state.plan.proxy_url,
        "processes": [
            {
                "name": r.name,
                "host": r.host,
                "stage": r.stage,
                "pid": r.pid,
                "pgid": r.pgid,
                "ports": r.ports,
                "log": r.log,
                "started_at": r.started_at,
                "status": r.status,
            }
            for r in state.processes
        ],
    }


def up_table(state: DeploymentState) -> Table:
    t = Table(title=f"{state.deployment}: {state.status}")
    for col in ("Process", "Host", "Stage", "PID", "Ports", "Status", "Log"):
        t.add_column(col)
    for r in state.processes:
        t.add_row(
            r.name,
            r.host,
            str(r.stage),
            str(r.pid),
            ",".join(map(str, r.ports)) or "-",
            Text(r.status, style=_PHASE_STYLE.get(r.status, "")),
            r.log,
        )
    return t


def down_json(result: DownResult) -> dict[str, Any]:
    return {
        "deployment": result.deployment,
        "nothing_running": result.nothing_running,
        "clean": result.clean,
        "processes": [
            {"name": o.name, "host": o.host, "result": o.how, "detail": o.detail}
            for o in result.stop.outcomes
        ],
        "busy_ports": result.stop.busy_ports,
    }


def down_table(result: DownResult) -> Table:
    t = Table(title=f"{result.deployment}: down")
    for col in ("Process", "Host", "Result", "Detail"):
        t.add_column(col)
    for o in result.stop.outcomes:
        style = "green" if o.gone else "bold red"
        t.add_row(o.name, o.host, Text(o.how, style=style), o.detail)
    return t


def status_json(deployment: str, rows: list[ProcessStatus]) -> dict[str, Any]:
    return {
        "deployment": deployment,
        "processes": [
            {
                "name": s.name,
                "host": s.host,
                "pid": s.pid,
                "alive": s.alive,
                "healthy": s.healthy,
                "uptime_s": s.uptime_s,
                "ports": s.ports,
                "listening": s.listening,
                "log": s.log,
                "detail": s.detail,
                "supervisor": dataclasses.asdict(s.supervisor) if s.supervisor else None,
                **_planner_json(s),
            }
            for s in rows
        ],
    }


def _planner_json(s: ProcessStatus) -> dict[str, Any]:
    if s.planner_planned is None:
        return {}
    said = {"planner": s.planner.planner, "isa": s.planner.isa} if s.planner else None
    return {"planner": {"planned": s.planner_planned, "reported": said}}


def _planner_cell(s: ProcessStatus) -> Text:
    """The planner the process's own log names, red where it is not the one planned."""
    if s.planner_planned is None:
        return Text("-", style="dim")
    if s.planner is None:
        return Text("not reported" if s.alive else "-", style="dim")
    wrong = s.planner_planned in ("kvpd", "upstream") and s.planner.planner != s.planner_planned
    if wrong:
        return Text(f"{s.planner.label} (planned: {s.planner_planned})", style="bold red")
    return Text(s.planner.label)


def status_table(deployment: str, rows: list[ProcessStatus]) -> Table:
    t = Table(title=f"{deployment}")
    supervised = any(s.supervisor for s in rows)
    planners = any(s.planner_planned is not None for s in rows)
    cols = ["Process", "Host", "PID", "Alive", "Healthy", "Uptime", "Ports"]
    cols += ["Restarts", "Last exit"] if supervised else []
    for col in cols + (["Planner (its log)"] if planners else []) + ["Detail"]:
        t.add_column(col)

    def yn(v: bool | None) -> Text:
        if v is None:
            return Text("-", style="dim")
        return Text("yes", style="green") if v else Text("no", style="red")

    for s in rows:
        ports = ",".join(f"{p}{'' if p in s.listening else '(closed)'}" for p in s.ports)
        t.add_row(
            s.name,
            s.host,
            str(s.pid),
            yn(s.alive),
            yn(s.healthy),
            fmt_duration(s.uptime_s),
            ports or "-",
            *(_supervision_cells(s) if supervised else []),
            *([_planner_cell(s)] if planners else []),
            s.detail,
        )
    return t


def _supervision_cells(s: ProcessStatus) -> list[str | Text]:
    sup = s.supervisor
    if sup is None:
        return ["-", "-"]
    restarts = Text(str(sup.restarts), style="yellow" if sup.restarts else "")
    last = sup.last_exit or "-"
    if sup.state == "failed":
        return [restarts, Text(f"{last} (gave up: {sup.gave_up or 'no restart'})", style="red")]
    return [restarts, last]


def preflight_json(checks: list[Check]) -> dict[str, Any]:
    return {"ok": all(c.ok for c in checks), "checks": [dataclasses.asdict(c) for c in checks]}


def preflight_table(deployment: str, checks: list[Check]) -> Table:
    t = Table(title=f"preflight: {deployment}")
    for col in ("host", "check", "result", "detail", "fix"):
        t.add_column(col)
    for c in checks:
        t.add_row(c.host, c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", c.detail, c.fix)
    return t


def show_preflight(deployment: str, checks: list[Check], *, as_json: bool) -> bool:
    """Print the checks (table or JSON); True when all passed."""
    if as_json:
        print_json(preflight_json(checks))
    else:
        out.print(preflight_table(deployment, checks))
    return all(c.ok for c in checks)


def events_table(deployment: str, events: list[Event]) -> Table:
    t = Table(title=f"events of {deployment}")
    for col in ("time", "who", "event", "detail"):
        t.add_column(col, overflow="fold")
    for e in events:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.at))
        style = "red" if e.what.endswith("failed") or e.data.get("ok") is False else None
        t.add_row(stamp, e.who, Text(e.what, style=style or ""), e.detail)
    return t


def diagnose_table(report: Report) -> Table:
    t = Table(title=f"diagnose {report.deployment}")
    for col in ("Process", "Host", "State", "Likely cause"):
        t.add_column(col, overflow="fold")
    for f in report.processes:
        ok = f.state in ("healthy", "running")
        t.add_row(f.name, f.host, Text(f.state, style="green" if ok else "red"), f.cause or "-")
    for p in report.problems:
        t.add_row("(hosts)", "", Text("problem", style="red"), p)
    return t
