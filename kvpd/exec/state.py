"""Deployment state: what `up` started where, in `<state root>/<deployment>/state.json`."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvpd import __version__
from kvpd.errors import StateError
from kvpd.exec import state_check
from kvpd.exec.bundle.result import BundleSlot
from kvpd.exec.local import private_dirs, replace_with
from kvpd.exec.records.model import DeploymentStatus, ProcessStatusWord
from kvpd.plan.value import Plan
from kvpd.profile.roles import Role

STATE_ENV = "KVPD_STATE_DIR"
STATE_FILE = "state.json"
FORMAT_VERSION = 1


def state_root() -> Path:
    """`$KVPD_STATE_DIR`, or `.kvpd` in the working directory."""
    env = os.environ.get(STATE_ENV)
    return Path(env) if env else Path.cwd() / ".kvpd"


@dataclass
class ProcessRecord:
    """One started process. `pid`, `pgid` and `start_ticks` identify it on its host."""

    name: str
    host: str
    stage: int
    pid: int
    pgid: int
    start_ticks: int
    ports: list[int]
    log: str  # absolute on its host
    started_at: float  # Unix time
    status: ProcessStatusWord = "running"
    # What the host record names too: the role and devices the plan gave it, and the digest of
    # what was launched (command, env, script), so drift is named per process.
    role: Role | Literal[""] = ""  # "": a cache an older kvpd wrote
    devices: list[int] = field(default_factory=list)
    launch_digest: str = ""


@dataclass
class DeploymentState:
    deployment: str
    profile_digest: str
    plan: Plan
    status: DeploymentStatus = "starting"
    run_dirs: dict[str, str] = field(default_factory=dict)  # host -> absolute run dir
    processes: list[ProcessRecord] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    updated_at: float = 0.0
    profile: str = ""  # the PROFILE argument `up` was given, for messages
    # node bundle: per host slot, what `up` verified (digest, interpreter, native implementation)
    bundle: list[BundleSlot] = field(default_factory=list)
    # Who started it (user@host of the controller), as every host record names it.
    started_by: str = ""
    # How to build the plan again (profile, inventory, sets, rehearse, base dir): a verb given
    # only the deployment's name rebuilds the plan from these and acts on that plan, never on
    # the cached one (a cache is trusted no more than a host record).
    recipe: dict[str, Any] = field(default_factory=dict)

    def record(self, name: str) -> ProcessRecord | None:
        for r in self.processes:
            if r.name == name:
                return r
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "kvpd_version": __version__,  # the kvpd that wrote it (diagnose archives carry it)
            "deployment": self.deployment,
            "profile_digest": self.profile_digest,
            "profile": self.profile,
            "status": self.status,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "run_dirs": self.run_dirs,
            "processes": [asdict(r) for r in self.processes],
            "bundle": [b.to_json() for b in self.bundle],
            "started_by": self.started_by,
            "recipe": self.recipe,
            "plan": self.plan.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeploymentState:
        return cls(
            deployment=d["deployment"],
            profile_digest=d["profile_digest"],
            plan=Plan.from_dict(d["plan"]),
            status=d.get("status", "starting"),
            run_dirs=dict(d.get("run_dirs", {})),
            processes=[_process(r) for r in d.get("processes", [])],
            created_at=d.get("created_at", 0.0),
            updated_at=d.get("updated_at", 0.0),
            profile=d.get("profile", ""),
            bundle=_bundle(d.get("bundle", [])),
            started_by=str(d.get("started_by", "")),
            recipe=dict(d.get("recipe") or {}),
        )


def _bundle(rows: object) -> list[BundleSlot]:
    if not isinstance(rows, list):
        raise ValueError(f"bundle: {rows!r} is not a list")
    return [BundleSlot.from_json(b, f"bundle[{i}]") for i, b in enumerate(rows)]


def _process(r: dict[str, Any]) -> ProcessRecord:
    rec = ProcessRecord(**r)
    rec.role = Role(rec.role) if rec.role else ""  # ValueError (corrupt) for an unknown word
    return rec


class StateStore:
    """Reads and atomically writes deployment states under one root."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else state_root()

    def path(self, deployment: str) -> Path:
        return self.root / deployment / STATE_FILE

    def deployments(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob(f"*/{STATE_FILE}"))

    def load(self, deployment: str) -> DeploymentState | None:
        p = self.path(deployment)
        if not p.exists() and not p.is_symlink():
            return None
        for path, what in ((self.root, "state root"), (p.parent, "deployment dir"),
                           (p, "state file")):  # fmt: skip
            state_check.check_owner(path, what)
        try:
            raw = p.read_text()
        except FileNotFoundError:
            return None
        try:
            state = DeploymentState.from_dict(json.loads(raw))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StateError(
                f"{p}: state file is corrupt ({e}). Inspect it; if nothing of deployment "
                f"{deployment!r} runs any more, delete it."
            ) from None
        return state_check.check(state, deployment, p)

    def require(self, deployment: str) -> DeploymentState:
        """The state of `deployment`; StateError naming the known ones if there is none."""
        state = self.load(deployment)
        if state is None:
            known = self.deployments()
            hint = f" Known deployments: {', '.join(known)}." if known else ""
            raise StateError(
                f"no state for deployment {deployment!r} under {self.root}.{hint} The hosts "
                "hold the records: give its profile (e.g. `kvpd status PROFILE --inventory "
                "FILE`, as `up` had them), or set KVPD_STATE_DIR to where `up` ran."
            )
        return state

    def save(self, state: DeploymentState) -> None:
        """Write temp file + fsync + rename (+ fsync of the directory): a reader or a crash
        sees either the old or the new state, never a torn one."""
        state.updated_at = time.time()
        p = self.path(state.deployment)
        private_dirs(p.parent)  # the state says what kvpd may signal and purge: only ours
        data = json.dumps(state.to_dict(), indent=2).encode()
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".state.", suffix=".tmp")  # 0600, new
        replace_with(fd, Path(tmp), p, data)
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
