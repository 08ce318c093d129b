"""The node wheel on the controller: kvpd's source as shipped, its digest, and local builds.

The source is the kvpd package this controller runs (its files, without build outputs), the
dist-info metadata (entry points included, so vLLM finds kvpd's plugin through the bundle folder)
and pybind11's headers. Its digest (`source_digest`) names what a host must hold; wheels built from
it are cached per platform under `$KVPD_CACHE_DIR` (default `~/.cache/kvpd`), so a second `up`
builds nothing: the controller's own builds in `wheels/<source>/<platform>/`, a host's (verified,
kvpd.exec.bundle.wheel_trust) in `.../<platform>/host-<name>/`. The cache is a store other users
cannot plant into (kvpd.exec.bundle.wheel_cache); each wheel's digest is recorded when it is stored
and checked when it is taken out and again right before it is sent to a host."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import kvpd
from kvpd.errors import KvpdError
from kvpd.exec.bundle import wheel_cache
from kvpd.exec.bundle.wheel_trust import ANY as ANY
from kvpd.exec.bundle.wheel_trust import (
    MAX_WHEEL_BYTES,
    Refused,
    check_platform,
    shown,
    wheel_name_ok,
)

BUILDER = Path(__file__).with_name("wheel_build.py")
# Package files that go into the wheel (as pyproject's package-data, plus the modules).
_SHIPPED = (".py", ".pyi", ".yaml", ".j2", ".cpp", ".hpp", ".inc", "py.typed")


@dataclass(frozen=True)
class Wheel:
    path: Path
    digest: str  # sha256 of the .whl file
    platform: str  # SOABI it was built for, or ANY
    native: bool
    why: str  # how the native core was built, or why it is missing
    origin: str = "local"  # who built it: "local" (this controller) or "host:NAME"

    @property
    def name(self) -> str:
        return self.path.name


def cache_dir() -> Path:
    env = os.environ.get("KVPD_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvpd"


def local_platform() -> str:
    """This controller's platform key: the SOABI of the Python running kvpd (arch + ABI)."""
    return str(sysconfig.get_config_var("SOABI") or f"{sys.implementation.cache_tag}")


def _package_root() -> Path:
    return Path(kvpd.__file__).resolve().parent


def _pyproject() -> Path | None:
    p = _package_root().parent / "pyproject.toml"
    return p if p.exists() else None


def _package_files() -> dict[str, bytes]:
    root = _package_root()
    out: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.name.endswith(_SHIPPED):
            out[path.relative_to(root.parent).as_posix()] = path.read_bytes()
    return out


def _dist_info() -> dict[str, bytes]:
    """METADATA (no Requires-Dist: the bundle is installed without dependencies) and the entry
    points of pyproject.toml (the vLLM plugin group among them)."""
    meta = f"Metadata-Version: 2.1\nName: kvpd\nVersion: {kvpd.__version__}\n"
    meta += "Summary: kvpd node bundle (connectors, native core, proxy)\n"
    groups: dict[str, dict[str, str]] = {}
    py = _pyproject()
    if py is not None and sys.version_info >= (3, 11):  # tomllib; on 3.10 the metadata says it
        import tomllib

        project = tomllib.loads(py.read_text()).get("project", {})
        groups = dict(project.get("entry-points", {}))
    else:
        import importlib.metadata as md

        try:
            for ep in md.distribution("kvpd").entry_points:
                if ep.group != "console_scripts":
                    groups.setdefault(ep.group, {})[ep.name] = ep.value
        except md.PackageNotFoundError:
            pass
    out = {"METADATA": meta.encode()}
    if groups:
        text = "".join(
            f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(eps.items())) + "\n"
            for g, eps in sorted(groups.items())
        )
        out["entry_points.txt"] = text.encode()
    return out


def _pybind11_headers() -> dict[str, bytes]:
    try:
        import pybind11
    except ImportError:
        return {}
    inc = Path(pybind11.get_include())
    return {
        "pybind11/" + p.relative_to(inc).as_posix(): p.read_bytes()
        for p in sorted(inc.rglob("*.h"))
    }


@lru_cache(maxsize=1)
def source_files() -> dict[str, bytes]:
    """Everything a build needs, by path in the source tree."""
    files = _package_files()
    files.update({f"dist-info/{k}": v for k, v in _dist_info().items()})
    files.update(_pybind11_headers())
    files["wheel_build.py"] = BUILDER.read_bytes()
    return files


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over the shipped source (names and contents): what a host's bundle must match."""
    h = hashlib.sha256()
    for name, data in sorted(source_files().items()):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def has_pybind11() -> bool:
    return any(k.startswith("pybind11/") for k in source_files())


def source_tarball() -> bytes:
    """The source as a deterministic .tar.gz, for building on a host."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for name, data in sorted(source_files().items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def write_source(dest: Path) -> None:
    for name, data in source_files().items():
        p = dest / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def reference_members() -> dict[str, bytes]:
    """The members of this kvpd's wheel as the controller makes it, without WHEEL and RECORD
    (computed from the members): what a host's build must hold byte for byte."""
    from kvpd.exec.bundle.wheel_build import NAME

    files = source_files()
    out = {k: v for k, v in files.items() if k.startswith(f"{NAME}/")}
    prefix = f"{NAME}-{kvpd.__version__}.dist-info/"
    out.update(
        {prefix + k[len("dist-info/") :]: v for k, v in files.items() if k.startswith("dist-info/")}
    )
    return out


def _folder(platform: str, source: str | None, built_on: str | None, create: bool) -> Path | None:
    """wheels/<source>/<platform>[/host-<name>]: a host's own build is kept apart from the
    controller's and from every other host's."""
    check_platform(platform, allow_any=True)
    parts = ["wheels", (source or source_digest())[:16], platform]
    if built_on is not None:  # a profile host name (kvpd.profile.types.PATH_NAME)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", built_on):
            raise wheel_cache.UnsafeCache(f"{built_on!r} cannot name a host in the wheel cache")
        parts.append(f"host-{built_on}")
    return wheel_cache.safe_dir(cache_dir(), *parts, create=create)


def builders_of(platform: str, source: str | None = None) -> list[str]:
    """The hosts whose builds for `platform` (this source) are in the cache."""
    d = _folder(platform, source, None, create=False)
    names = sorted(os.listdir(d)) if d is not None else []
    return [n[len("host-") :] for n in names if n.startswith("host-")]


def cached(platform: str, source: str | None = None, built_on: str | None = None) -> Wheel | None:
    """The cached wheel of this source for `platform` (the controller's own build, or with
    `built_on` that host's), checked against the digest recorded when it was stored."""
    d = _folder(platform, source, built_on, create=False)
    raw = None if d is None else wheel_cache.read(d, "wheel.json", 1 << 16)
    if d is None or raw is None:
        return None
    try:
        m = json.loads(raw)
        name, digest, native, why = m["name"], m["digest"], m["native"], m["why"]
    except (ValueError, KeyError, TypeError):
        return None
    ok = wheel_name_ok(name) and isinstance(native, bool) and isinstance(why, str)
    if not ok or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise wheel_cache.UnsafeCache(f"{d / 'wheel.json'} is not a record kvpd wrote: remove {d}")
    data = wheel_cache.read(d, name, MAX_WHEEL_BYTES)
    if data is None or hashlib.sha256(data).hexdigest() != digest:
        return None  # gone or changed since it was stored: built again
    origin = "local" if built_on is None else f"host:{built_on}"
    return Wheel(d / name, digest, platform, native, why, origin)


def store(
    platform: str, name: str, data: bytes, native: bool, why: str, built_on: str | None = None
) -> Wheel:
    """Put a wheel (the controller's own, or one built on host `built_on` and verified) into
    the cache: folders 0700, files written create-new and renamed into place, digest recorded."""
    if not wheel_name_ok(name):
        raise Refused(f"{shown(name)} is not the file name of a kvpd wheel")
    d = _folder(platform, None, built_on, create=True)
    assert d is not None
    path = wheel_cache.write(d, name, data)
    digest = hashlib.sha256(data).hexdigest()
    meta = {"name": name, "digest": digest, "native": native, "why": why}
    wheel_cache.write(d, "wheel.json", json.dumps(meta).encode())
    return Wheel(
        path, digest, platform, native, why, "local" if built_on is None else f"host:{built_on}"
    )


def wheel_bytes(w: Wheel) -> bytes:
    """A cached wheel's content, checked again against its digest right before it is used."""
    data = wheel_cache.read(w.path.parent, w.path.name, MAX_WHEEL_BYTES)
    if data is None or hashlib.sha256(data).hexdigest() != w.digest:
        raise wheel_cache.UnsafeCache(
            f"{w.path} changed after kvpd checked it: remove {w.path.parent} and run `up` again"
        )
    return data


def build_local(*, native: bool = True) -> Wheel:
    """This controller's wheel (native core for its own platform, or the pure one), cached."""
    platform = local_platform() if native else ANY
    hit = cached(platform)
    if hit is not None:
        return hit
    with tempfile.TemporaryDirectory(prefix="kvpd-src-") as tmp:
        src = Path(tmp) / "src"
        write_source(src)
        argv = [sys.executable, "-I", str(src / "wheel_build.py"), str(src), str(Path(tmp) / "out")]
        if not native:
            argv.append("--no-native")
        r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise KvpdError(f"building kvpd's node wheel failed: {r.stderr.strip()[-500:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        data = (Path(tmp) / "out" / Path(res["wheel"]).name).read_bytes()
        # Cached under the asked platform even when the compiler failed (res["native"] False):
        # the next `up` does not retry a build that cannot work.
        return store(platform, Path(res["wheel"]).name, data, res["native"], res["why"])


def build_cross(platform: str) -> Wheel | str:
    """The wheel for `platform` cross-built on this controller (kvpd.exec.cross_build), cached;
    or why it could not be built."""
    from kvpd.exec import cross_build  # late: only `up`s with foreign platforms need it

    hit = cached(platform)
    if hit is not None:
        return hit
    target = cross_build.platform_target(platform)
    if target is None:
        return f"the controller cannot cross-build for {platform}"
    chain = cross_build.find_toolchain(*target)
    if isinstance(chain, str):
        return chain
    with tempfile.TemporaryDirectory(prefix="kvpd-cross-") as tmp:
        src = Path(tmp) / "src"
        write_source(src)
        try:
            res = cross_build.build_wheel(chain, src, Path(tmp) / "out")
        except cross_build.CrossBuildError as e:
            return str(e)
        path = Path(str(res["wheel"]))
        return store(platform, path.name, path.read_bytes(), True, str(res["why"]))
