"""What the controller accepts from a host about the node wheel, and how it checks a host's build.

Everything a host reports is untrusted input: its platform key (the SOABI of its Python) becomes a
folder of the wheel cache, a wheel's file name becomes a file there, and a wheel a host built is
installed on hosts and cached for later `up`s. So each value is checked against a strict grammar
and against what the controller derives itself, and a host-built wheel is taken apart on the
controller: every member but the native extension must be byte-identical to the controller's own
source of this kvpd, nothing else may be in it (no `.pth`, no `sitecustomize.py`, no `*.data/`),
and the wheel that is cached and installed is packed again here, from the controller's own files
plus those extensions (one per module of kvpd/native/sources.py), with a WHEEL and RECORD the
controller computed.
"""

from __future__ import annotations

import io
import posixpath
import re
import unicodedata
import zipfile
from dataclasses import dataclass

from kvpd import __version__
from kvpd.errors import KvpdError
from kvpd.exec.bundle import wheel_build
from kvpd.native.sources import EXTENSIONS

ANY = "any"  # platform key of a wheel without the native core (the controller's own key)
# A SOABI as CPython and PyPy spell it (cpython-312-x86_64-linux-gnu, pypy310-pp73-x86_64-linux-gnu)
# or the cache tag of a Python without one (cpython-312): lower-case words joined by "-", so it
# is always one plain path component.
PLATFORM = re.compile(r"^[a-z][a-z0-9]{1,15}(-[a-z0-9_]{1,32}){1,5}$")
_WHEEL_NAME = re.compile(
    rf"^{wheel_build.NAME}-{re.escape(__version__)}-"
    r"(?P<py>[a-z]{2}[0-9]{1,4})-(?P<abi>[a-z0-9_]{1,32})-(?P<plat>[a-z0-9_]{1,64})\.whl$"
)
_CPYTHON_LINUX = re.compile(r"^cpython-(?P<ver>[0-9]{2,4})t?-(?P<arch>[a-z0-9_]+)-linux-[a-z]+$")
PURE_TAG = "py3-none-any"
MAX_WHEEL_BYTES = 64 << 20  # kvpd's wheel is under 2 MiB; a bigger one is refused unread


class Refused(KvpdError):
    """A value or a wheel from a host that the controller does not accept."""


def platform_ok(value: object) -> bool:
    """A platform key a host may report (never ANY: that one is the controller's)."""
    return isinstance(value, str) and value != ANY and PLATFORM.fullmatch(value) is not None


def check_platform(value: object, *, allow_any: bool = False) -> str:
    if allow_any and value == ANY:
        return ANY
    if not platform_ok(value):
        raise Refused(
            f"{shown(value)} is not a Python platform key (e.g. cpython-312-x86_64-linux-gnu)"
        )
    return str(value)


def wheel_name_ok(name: object) -> bool:
    return isinstance(name, str) and _WHEEL_NAME.fullmatch(name) is not None


def tag_of(name: str) -> str:
    m = _WHEEL_NAME.fullmatch(name)
    if m is None:
        raise Refused(f"{shown(name)} is not the file name of a kvpd {__version__} wheel")
    return f"{m['py']}-{m['abi']}-{m['plat']}"


def expected_tag(platform: str) -> str | None:
    """The tag wheel_build gives a native wheel for this platform, when the controller can
    derive it (CPython on Linux); None for other interpreters."""
    m = _CPYTHON_LINUX.fullmatch(platform)
    if m is None:
        return None
    return f"cp{m['ver']}-cp{m['ver']}-linux_{m['arch']}"


def native_members(platform: str) -> tuple[str, ...]:
    """The members a host build adds: one extension per native module, named by the
    platform's EXT_SUFFIX (all or none: wheel_build compiles them together)."""
    return tuple(f"{m.replace('.', '/')}.{platform}.so" for m in EXTENSIONS)


def native_member(platform: str) -> str:
    """The sparse-LRU core's member (the first of native_members)."""
    return native_members(platform)[0]


def shown(value: object, limit: int = 80) -> str:
    """A host-supplied value as it may appear in a message: printable characters only."""
    text = str(value)
    text = "".join(c if unicodedata.category(c)[0] not in "CZ" or c == " " else "?" for c in text)
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


@dataclass(frozen=True)
class Verified:
    name: str  # the wheel's file name (the controller's, from the checked tag)
    data: bytes  # the wheel packed again on the controller
    native: bool


def _checked_tag(data: bytes, name: object, platform: str) -> str:
    """The wheel's tag from its name: a kvpd wheel's, the one `platform` makes (or pure)."""
    check_platform(platform)
    tag = tag_of(str(name)) if wheel_name_ok(name) else None
    if tag is None:
        raise Refused(f"the built wheel's name {shown(name)} is not a kvpd wheel's")
    want = expected_tag(platform)
    if tag != PURE_TAG and want is not None and tag != want:
        raise Refused(f"the built wheel is tagged {tag}, but a {platform} Python makes {want}")
    if len(data) > MAX_WHEEL_BYTES:
        raise Refused(f"the built wheel has {len(data)} bytes (more than {MAX_WHEEL_BYTES})")
    return tag


def _same_members(
    members: dict[str, bytes],
    reference: dict[str, bytes],
    computed: set[str],
    exts: tuple[str, ...],
) -> None:
    """The controller's members, byte for byte, and nothing else but the extensions and the
    files computed from the members."""
    extra = sorted(set(members) - set(reference) - computed - set(exts))
    if extra:
        raise Refused(f"the built wheel has members the controller's does not: {_few(extra)}")
    missing = sorted(set(reference) - set(members))
    if missing:
        raise Refused(f"the built wheel lacks members of the controller's: {_few(missing)}")
    changed = sorted(n for n in reference if members[n] != reference[n])
    if changed:
        raise Refused(
            f"the built wheel's {_few(changed)} differ from the controller's source of this kvpd"
        )


def _extensions(members: dict[str, bytes], exts: tuple[str, ...], tag: str) -> list[str]:
    """The native extensions the wheel holds: all of them (tagged for the platform, ELF) or
    none (the pure wheel)."""
    present = [e for e in exts if e in members]
    native = bool(present)
    if native and len(present) != len(exts):
        raise Refused(f"the built wheel has {_few(present)} but not all of {_few(list(exts))}")
    if native != (tag != PURE_TAG):
        raise Refused(f"the built wheel is tagged {tag} but {'has' if native else 'lacks'} "
                      f"{_few(list(exts))}")  # fmt: skip
    for ext in present:
        if not members[ext].startswith(b"\x7fELF"):
            raise Refused(f"the built wheel's {ext} is not an ELF shared object")
    return present


def verify_host_wheel(
    data: bytes, name: object, platform: str, reference: dict[str, bytes]
) -> Verified:
    """Check a wheel `platform`'s host built against `reference` (the controller's members of
    this kvpd's wheel: package files and dist-info without WHEEL and RECORD); raise Refused
    saying what differs. Returns the wheel packed again from the controller's own files plus
    the host's extension (the only member a host supplies)."""
    tag = _checked_tag(data, name, platform)
    members = _members(data)
    info = f"{wheel_build.NAME}-{__version__}.dist-info"
    computed = {f"{info}/WHEEL", f"{info}/RECORD"}
    exts = native_members(platform)
    _same_members(members, reference, computed, exts)
    present = _extensions(members, exts, tag)
    files = dict(reference)
    files.update({ext: members[ext] for ext in present})
    expected = wheel_build.with_wheel_files(files, tag)
    for n in sorted(computed):
        if members.get(n) != expected[n]:
            raise Refused(
                f"the built wheel's {posixpath.basename(n)} is not the one of its members"
            )
    return Verified(
        f"{wheel_build.NAME}-{__version__}-{tag}.whl", wheel_build.pack(files, tag), bool(present)
    )


def _members(data: bytes) -> dict[str, bytes]:
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
        infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise Refused(f"the built wheel is not a zip archive ({e})") from e
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise Refused("the built wheel names a member twice")
    if sum(i.file_size for i in infos) > 4 * MAX_WHEEL_BYTES:
        raise Refused("the built wheel unpacks to more than the controller accepts")
    out = {}
    for i in infos:
        n = i.filename
        if i.is_dir() or n.startswith("/") or "\\" in n or ".." in n.split("/"):
            raise Refused(f"the built wheel has the member {shown(n)}, not a plain file path")
        try:
            out[n] = z.read(i)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
            raise Refused(f"the built wheel's member {shown(n)} cannot be read ({e})") from e
    return out


def _few(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
