"""What the bundle step found and did per host slot, and the verdict on it: which slots cannot
be served, with the fix for each (kvpd.exec.bundle.installer does the work).

`BundleSlot` is a slot's outcome as the deployment state records it. The state file is input
(kvpd.exec.state_check), so `BundleSlot.from_json` checks every field it loads: its type, the
grammar of the digest, platform and wheel origin, and refuses a field kvpd never writes."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from kvpd.errors import DeployError
from kvpd.exec.bundle.wheel_trust import ANY, platform_ok
from kvpd.plan.bundle import BundleSlotName, BundleUse
from kvpd.profile.types import PATH_NAME

BundleAction = Literal["kept", "installed", "failed"]
Implementation = Literal["native", "numpy"]
# Where a slot's wheel came from (kvpd.exec.bundle.host.origin says each in words): the
# controller's build or cross-build, the wheel without the native core, a host's build (just
# now or cached), an earlier `up` whose wheel the cache no longer holds; "" before it is known.
_HOST = PATH_NAME.removeprefix("^").removesuffix("$")  # a profile's host name
_SOURCE = re.compile(rf"^(|local|cross|{ANY}|earlier|(cache:)?host:{_HOST})$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
NativeValue = str | int | float | bool | None
_SCALARS = (str, int, float, bool, type(None))


@dataclass
class SlotResult:
    """What the bundle step found and did for one slot, while it works on it."""

    host: str
    slot: BundleSlotName
    python: str  # as the plan says it
    report: dict[str, Any] = field(default_factory=dict)  # the node script's last JSON line
    action: BundleAction = "kept"
    source: str = ""  # where the installed wheel came from (see _SOURCE)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.report.get("ready"))

    def recorded(self) -> BundleSlot:
        """The outcome as the deployment state records it."""
        rep = self.report
        # The host's native info is not vetted field by field (kvpd.exec.bundle.host.vet):
        # only plain values are recorded, so what is written always loads again.
        native = {
            k: v
            for k, v in (rep.get("native") or {}).items()
            if isinstance(k, str) and isinstance(v, _SCALARS)
        }
        impl = next(
            (i for i in get_args(Implementation) if i == native.get("implementation")), None
        )
        return BundleSlot(
            host=self.host,
            slot=self.slot,
            python=self.python,
            executable=rep.get("executable"),
            version=rep.get("version"),
            platform=rep.get("platform"),
            digest=rep.get("digest"),
            folder=rep.get("folder"),
            implementation=impl,
            compiler=rep.get("compiler"),
            native=native,
            action=self.action,
            source=self.source,
            seconds=round(self.seconds, 3),
            problem=str(rep.get("problem") or ""),
        )


@dataclass(frozen=True)
class BundleSlot:
    """What `up` verified on one host slot: the interpreter, the bundle's digest and folder,
    the native implementation it loads, what `up` did and where the wheel came from. The fields
    a host reported are None when it did not report them."""

    host: str
    slot: BundleSlotName
    python: str  # as the plan says it
    executable: str | None = None
    version: str | None = None  # the interpreter's X.Y.Z
    platform: str | None = None  # its platform key (SOABI)
    digest: str | None = None  # sha256 of the installed wheel
    folder: str | None = None  # the verified bundle folder on the host
    implementation: Implementation | None = None
    compiler: bool | None = None  # the host can build the native core (g++, Python headers)
    # What the native core reported: compiler, isa_flags, ascend_planner, reason, ...
    native: Mapping[str, NativeValue] = field(default_factory=dict)
    action: BundleAction = "kept"
    source: str = ""  # see _SOURCE
    seconds: float = 0.0
    problem: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["native"] = dict(self.native)
        return out

    @staticmethod
    def from_json(d: object, where: str = "bundle") -> BundleSlot:
        """The slot of a loaded state; ValueError naming the field that is not as kvpd writes
        it (an older kvpd's state without a later field loads with that field's default)."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: {d!r} is not an object")
        known = {f.name for f in fields(BundleSlot)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}")
        for name in ("host", "slot", "python"):
            if name not in d:
                raise ValueError(f"{where}: missing field {name!r}")
        for name, (ok, what) in _FIELDS.items():
            if name in d and not ok(d[name]):
                raise ValueError(f"{where}.{name}: {d[name]!r} is not {what}")
        return BundleSlot(**{**d, "native": dict(d.get("native", {}))})


def _text(v: object) -> bool:
    return isinstance(v, str)


def _text_or_none(v: object) -> bool:
    return v is None or isinstance(v, str)


def _native(v: object) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, _SCALARS) for k, x in v.items()
    )


# Each field's check and what the message says it must be: one table, so they cannot drift.
_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "host": (
        lambda v: isinstance(v, str) and re.fullmatch(PATH_NAME, v) is not None,
        "a host name",
    ),
    "slot": (
        lambda v: v in get_args(BundleSlotName),
        f"one of {', '.join(get_args(BundleSlotName))}",
    ),
    "python": (_text, "text"),
    "executable": (_text_or_none, "text or null"),
    "version": (_text_or_none, "text or null"),
    "platform": (lambda v: v is None or platform_ok(v), "a Python platform key or null"),
    "digest": (
        lambda v: v is None or (isinstance(v, str) and _DIGEST.fullmatch(v) is not None),
        "a sha256 (64 hex digits) or null",
    ),
    "folder": (_text_or_none, "text or null"),
    "implementation": (
        lambda v: v is None or v in get_args(Implementation),
        f"one of {', '.join(get_args(Implementation))} or null",
    ),
    "compiler": (lambda v: v is None or isinstance(v, bool), "true, false or null"),
    "native": (_native, "an object of plain values"),
    "action": (
        lambda v: v in get_args(BundleAction),
        f"one of {', '.join(get_args(BundleAction))}",
    ),
    "source": (
        lambda v: isinstance(v, str) and _SOURCE.fullmatch(v) is not None,
        "where a wheel comes from (local, cross, any, earlier, host:NAME, cache:host:NAME)",
    ),
    "seconds": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
        "a number of seconds",
    ),
    "problem": (_text, "text"),
}


def judge(results: list[SlotResult], uses: dict[tuple[str, BundleSlotName], BundleUse]) -> None:
    """Raise DeployError listing every slot that cannot be served, each with its fix."""
    problems = []
    for r in results:
        u = uses[(r.host, r.slot)]
        rep = r.report
        where = f"{r.host} ({r.slot}: {u.python})"
        if not r.ok:
            fix = fix_hint(rep)
            problems.append(f"{where}: {rep.get('problem', 'not installed')}. {fix}")
        elif u.native == "required" and (rep.get("native") or {}).get("implementation") != "native":
            problems.append(
                f"{where}: the kvpd planner needs the native core, but this host got the "
                "NumPy fallback. Install g++ and the Python headers on a host of platform "
                f"{rep.get('platform')} (the next `up` builds the core there and replaces the "
                "fallback), or set decode.sparse_offload.planner: upstream."
            )
    if problems:
        raise DeployError("node bundle: " + "\n  ".join(["", *problems]).lstrip("\n "))


def fix_hint(rep: dict[str, Any]) -> str:
    if rep.get("too_old"):
        return "Use a Python >= 3.10 for this process (e.g. set the profile's python)."
    if rep.get("problem") == "interpreter not found":
        return "Install it or set its full path in the profile."
    if rep.get("platform") and not rep.get("pip"):
        return f"Install pip for {rep.get('executable')} (python -m ensurepip)."
    return "See the message; `kvpd up` retries the install."
