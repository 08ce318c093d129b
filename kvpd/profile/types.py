"""Checked string types of the profile: what may reach a shell, a path or a config file.

Every value that becomes a path component, an environment variable name, an address or a key of
a rendered config file is constrained here, in the schema, so a bad value is refused with its
YAML line before anything is derived from it.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that become path components (host folders of `plan --out`, run dirs): no separators,
# no leading dot or dash, bounded length.
PATH_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)
NIC = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}$"  # Linux IFNAMSIZ: 15 characters
HASHSEED_MAX = 4294967295


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or a `localhost` name: on every host, that host itself."""
    a = address.lower().rstrip(".")
    if a == "localhost" or a.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(a).is_loopback
    except ValueError:
        return False


TransportKind = Literal["ssh", "local"]


def on_this_machine(transport: TransportKind | None, address: str) -> bool:
    """The one rule for "this host is the machine kvpd runs on": the profile says its
    transport is local, or its address is a loopback one (the host itself, wherever asked)."""
    return transport == "local" or is_loopback(address)


def transport_of(transport: TransportKind | None, address: str) -> TransportKind:
    """How kvpd reaches a host: as the profile says, else `local` on this machine, else ssh."""
    return transport or ("local" if on_this_machine(None, address) else "ssh")


def is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _address(v: str) -> str:
    if is_ip(v):
        return v
    numeric = all(label.isdigit() for label in v.rstrip(".").split("."))
    if numeric:  # 192.168.1 or 999.1.1.1: meant as an IPv4 address, and not one
        raise ValueError(f"{v!r} is not a valid IPv4 address; write four numbers 0-255")
    if _HOSTNAME.fullmatch(v):
        return v
    raise ValueError(
        f"{v!r} is not an IPv4/IPv6 address or a host name (letters, digits, '-' and '.'); "
        "write e.g. 192.168.10.1"
    )


def _env_name(v: str) -> str:
    if not ENV_NAME.fullmatch(v):
        raise ValueError(
            f"{v!r} is not an environment variable name; use letters, digits and '_' and "
            "do not start with a digit (e.g. MY_VAR)"
        )
    return v


def _whole_number_as_text(v: Any) -> Any:
    """YAML reads `PYTHONHASHSEED: 0` or a byte count as a number: take whole numbers as their
    text, but never a bool (`true` would silently become "True")."""
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return v


def _no_control(v: str) -> str:
    if any((ch < " " and ch != "\t") or ch == "\x7f" for ch in v):
        raise ValueError(
            "must be one line without control characters (newline, NUL, ...); remove them"
        )
    return v


def _unique(v: list[Any]) -> list[Any]:
    seen = set()
    for item in v:
        if item in seen:
            raise ValueError(f"{item!r} is listed twice; list each entry once")
        seen.add(item)
    return v


def _storage(v: str) -> str:
    if not v.strip() or any(not part.strip() for part in v.split(":")):
        raise ValueError(
            "is empty (or has an empty ':'-separated entry); give the shared directory, "
            "e.g. /mnt/ucm"
        )
    return v


def shared_folder(path: str) -> bool:
    """The root, a top-level folder, `/home`, `/root`, a user's home or `~`/`.` (the login
    folder a relative run dir starts from): never a run dir of its own, since kvpd writes conf/,
    logs/ and bundle/ into one and `kvpd down --purge` removes it."""
    norm = posixpath.normpath(path)
    if norm in (".", "~") or (norm.startswith("~") and "/" not in norm):
        return True
    if not posixpath.isabs(norm):
        return False
    depth = len([p for p in norm.split("/") if p])
    return depth < 2 or norm in ("/root", "/home") or (norm.startswith("/home/") and depth < 3)


def _run_dir(v: str) -> str:
    if not v.strip():
        raise ValueError("is empty; give the run dir a folder of its own, or leave the field out")
    if ".." in v.split("/"):
        raise ValueError(
            f"{v!r} has a '..' component: a run dir is named directly (`kvpd down --purge` "
            "empties it), e.g. /opt/kvpd/<name>; write the path without '..'"
        )
    if shared_folder(v):
        raise ValueError(
            f"{v!r} is the root, a top-level or a home folder. kvpd writes conf/, logs/ and "
            "bundle/ into the run dir and `kvpd down --purge` removes it: give it a folder of "
            "its own, e.g. /opt/kvpd/<name>, or leave the field out."
        )
    return v


_HUMAN_INT = re.compile(r"^(?:\d+|\d+(?:\.\d+)?[kmgt]|\d+[KMGT])$")


def _human_int(v: str) -> str:
    # vLLM's human_readable_int: 1k/1m/1g/1t are powers of 10 (decimals allowed), 1K/1M/1G/1T
    # powers of 2 (whole numbers only)
    if not _HUMAN_INT.match(v):
        raise ValueError(
            f"{v!r} is not a byte count vLLM reads; write a whole number of bytes, or e.g. 16M "
            "(MiB), 4G (GiB), 2.5g (10^9)"
        )
    return v


def _not_empty(v: str) -> str:
    if not v.strip():
        raise ValueError("is empty; give a value or leave the field out")
    return v


def _relative_file(v: str) -> str:
    parts = [p for p in v.split("/") if p]
    if not parts or ".." in parts or v.startswith("~"):
        raise ValueError(
            f"{v!r} must be an absolute path or a path inside the run directory, without '..'"
        )
    return v


def _controller_file(v: str | None) -> str | None:
    if v is None:
        return v
    _no_control(v)
    if not (v.startswith("/") or v.startswith("~/")) or ".." in v.split("/"):
        raise ValueError(f"{v!r} must be an absolute path (or ~/...) without '..'")
    return v


def _jump(v: str) -> str:
    for hop in v.split(","):
        user, _, rest = hop.strip().rpartition("@")
        host, _, port = rest.partition(":") if not rest.startswith("[") else (rest, "", "")
        ok = bool(host) and (is_ip(host.strip("[]")) or bool(_HOSTNAME.fullmatch(host)))
        ok = ok and (not port or (port.isdigit() and 1 <= int(port) <= 65535))
        ok = ok and (not user or bool(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", user)))
        if not ok:
            raise ValueError(f"{hop!r} is not user@host:port; write e.g. admin@bastion:22")
    return v


def _json_data(v: Any) -> Any:
    """Values rendered with json.dumps: plain JSON data only (no dates, no NaN)."""

    def ok(x: Any) -> bool:
        if x is None or isinstance(x, (str, bool, int)):
            return True
        if isinstance(x, float):
            return x == x and x not in (float("inf"), float("-inf"))
        if isinstance(x, list):
            return all(ok(i) for i in x)
        if isinstance(x, dict):
            return all(isinstance(k, str) and ok(i) for k, i in x.items())
        return False

    if not ok(v):
        raise ValueError(
            "holds a value JSON cannot carry (a date, NaN, infinity or binary); quote it as text"
        )
    return v


def _command(v: str) -> str:
    if not v.strip():
        raise ValueError("is empty; give the command or path")
    return v


Address = Annotated[str, AfterValidator(_address)]
Command = Annotated[str, AfterValidator(_no_control), AfterValidator(_command)]
EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(_whole_number_as_text), AfterValidator(_no_control)]
Env = dict[EnvName, EnvValue]  # PYTHONHASHSEED's range is a rule (kvpd.plan.rules.env)
HostName = Annotated[str, Field(pattern=PATH_NAME)]
HostList = Annotated[list[HostName], Field(min_length=1), AfterValidator(_unique)]
Line = Annotated[str, AfterValidator(_no_control)]
Text = Annotated[str, AfterValidator(_no_control), AfterValidator(_not_empty)]
HumanInt = Annotated[str, BeforeValidator(_whole_number_as_text), AfterValidator(_human_int)]
RunDir = Annotated[str, AfterValidator(_no_control), AfterValidator(_run_dir)]
NicName = Annotated[str, Field(pattern=NIC)]
Storage = Annotated[str, AfterValidator(_no_control), AfterValidator(_storage)]
RelativeFile = Annotated[str, AfterValidator(_no_control), AfterValidator(_relative_file)]
Jump = Annotated[str, AfterValidator(_jump)]
# proxy.client_key_file: a file on the controller, read by the commands that need the key
ClientKeyFile = Annotated[
    str | None,
    AfterValidator(_controller_file),
    Field(
        description="file on the controller (mode 0600) with the key the proxy's clients must "
        "send as `Authorization: Bearer <key>` (one line, at least 32 characters); `up` copies "
        "it to the proxy's host, the canary and `kvpd bench` send it. OPENAI_API_KEY in env "
        "is another credential: the proxy's key for the engines, used only for clients that "
        "sent this one (kvpd proxy only)"
    ),
]
JsonData = Annotated[dict[str, Any], AfterValidator(_json_data)]
