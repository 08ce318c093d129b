"""The bundle step against hosts that lie: what a node reports never becomes a path on the
controller, a wheel a host built is verified before it is cached or spread, the wheel cache is
trusted only when nobody else can write it, and a host's installed bundle is exactly the wheel.

`Liar` is a stand-in host for fault injection (it answers the bundle step's commands with what a
compromised node could send); the install tests run the real step on this machine.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvpd.cli.bundle_view import status_table
from kvpd.exec.bundle import wheel as wheels
from kvpd.exec.bundle import wheel_build
from kvpd.exec.bundle.host import BUILD_SH, BUILT, CHECK_SH, vet
from kvpd.exec.bundle.installer import BundleInstaller
from kvpd.exec.bundle.preflight import preflight_checks
from kvpd.exec.bundle.wheel_cache import UnsafeCache
from kvpd.exec.bundle.wheel_trust import Refused, native_member, native_members, verify_host_wheel
from kvpd.exec.local import LocalTransport
from kvpd.exec.preflight.checks import Check
from kvpd.exec.report import NullReporter
from kvpd.exec.transport import CommandResult
from kvpd.plan.bundle import BundleUse
from kvpd.plan.value import HostSpec, Plan

FOREIGN = "cpython-311-aarch64-linux-gnu"
TAG = "cp311-cp311-linux_aarch64"


def plan_of(run: Path, *hosts: str, builders: tuple[str, ...] = ()) -> Plan:
    specs = tuple(
        HostSpec(name=h, address="127.0.0.1", transport="local", run_dir=str(run / h),
                 bundle_builder=h in builders)
        for h in hosts
    )  # fmt: skip
    uses = tuple(
        BundleUse(h, "proxy", sys.executable, ("proxy",), ("proxy: kvpd proxy",)) for h in hosts
    )
    return Plan("t", "0", specs, (), (), bundle=uses)


@pytest.fixture(autouse=True)
def _no_cross_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about host builds: the controller's aarch64 cross-build (which would
    serve FOREIGN itself when the cross toolchain is installed) is out of the picture."""
    from kvpd.exec import cross_build

    monkeypatch.setattr(cross_build, "buildable", lambda platforms: frozenset())


def host_wheel(extra: dict[str, bytes] | None = None, tag: str = TAG) -> bytes:
    """A wheel as an honest aarch64 host builds it (the extension is a stand-in ELF), with
    `extra` members changed or added."""
    files = {**wheels.reference_members()}
    files.update({m: b"\x7fELF stand-in" for m in native_members(FOREIGN)})
    files.update(extra or {})
    return wheel_build.pack(files, tag)


class Liar:
    """A host that says whatever `report` and `built` say (fault injection)."""

    def __init__(self, report: dict[str, Any], built: dict[str, Any], wheel: bytes) -> None:
        self.host = "evil"
        self.report, self.built, self.wheel = report, built, wheel
        self.installed: dict[str, Any] = {"ready": False, "problem": "stand-in host"}
        self.reads: list[str] = []
        self.puts: list[str] = []

    def run(self, argv: list[str], **_: object) -> CommandResult:
        out = ""
        if argv[:3] == ["bash", "-c", CHECK_SH]:
            out = json.dumps({"slot": "proxy", "ready": False, **self.report})
        elif argv[:3] == ["bash", "-c", BUILD_SH]:
            out = json.dumps(self.built)
        elif argv[0] == "stat":
            out = f"{len(self.wheel)} regular file"
        elif "install" in argv:
            out = json.dumps(self.installed)
        return CommandResult(tuple(argv), 0, out + "\n", "")

    def put(self, path: str, content: bytes, **_: object) -> None:
        self.puts.append(path)

    def read(self, path: str) -> bytes:
        self.reads.append(path)
        return self.wheel


def facts(platform: str) -> dict[str, Any]:
    return {"platform": platform, "pip": True, "compiler": True, "executable": "/usr/bin/python3"}


def run_liar(tmp: Path, liar: Liar) -> tuple[BundleInstaller, list[Any]]:
    inst = BundleInstaller(
        lambda h: liar, build_local=lambda **kw: wheels.build_local(native=False)
    )
    with pytest.raises(Exception) as e:  # the stand-in never installs: `up` fails
        inst.install(plan_of(tmp, "evil"), {"evil": str(tmp / "run")})
    return inst, [e.value]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVPD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- what a node reports never becomes a path on the controller ---------------------------------


@pytest.mark.parametrize("platform", ["{victim}", "../../../{name}", "cpython-311/../../x", "any"])
def test_a_reported_platform_is_no_path(cache: Path, tmp_path: Path, platform: str) -> None:
    """Regression: the platform a node reported named the cache folder the controller wrote
    the node's bytes into (absolute: anywhere; `..`: out of the cache)."""
    victim = tmp_path / "victim"
    platform = platform.format(victim=victim, name=victim.name)
    liar = Liar(facts(platform), {"wheel": "/x/authorized_keys", "native": True}, b"ssh-ed25519 X")
    inst, (err,) = run_liar(tmp_path, liar)
    assert not victim.exists()
    assert "not a Python platform key" in str(err)
    assert "does not trust this host" in str(err)
    assert liar.reads == []  # nothing was fetched from it
    assert not any(p.name != "cache" for p in tmp_path.iterdir() if p.name != "run")


def test_the_built_wheel_is_read_from_the_path_the_controller_named(
    cache: Path, tmp_path: Path
) -> None:
    """Regression: the controller read whatever path the node's build result named."""
    built = {"wheel": "/etc/shadow", "native": True, "why": "\x1b[2Jbuilt"}
    liar = Liar(facts(FOREIGN), built, host_wheel())
    inst, _ = run_liar(tmp_path, liar)
    assert len(liar.reads) == 1
    assert liar.reads[0].endswith(f"/.build-{wheels.source_digest()[:16]}/{BUILT}")
    # the build's name was not a kvpd wheel's: refused, nothing cached
    assert any("was refused" in w and "not a kvpd wheel" in w for w in inst.warnings), inst.warnings
    assert wheels.cached(FOREIGN, built_on="evil") is None


def test_the_cache_refuses_names_and_platforms_that_are_no_plain_component(
    cache: Path, tmp_path: Path
) -> None:
    w = wheels.build_local(native=False)
    data = w.path.read_bytes()
    bad = [(str(tmp_path / "abs"), w.name), ("../up", w.name), (FOREIGN, "../x.whl")]
    bad += [(FOREIGN, "authorized_keys"), (FOREIGN, f"/tmp/{w.name}")]
    for platform, name in bad:
        with pytest.raises((Refused, UnsafeCache)):
            wheels.store(platform, name, data, False, "")
    for built_on in ("../x", "a/b", ""):
        with pytest.raises(UnsafeCache):
            wheels.store(FOREIGN, w.name, data, False, "", built_on=built_on)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_reports_are_vetted_field_by_field() -> None:
    ok = vet(
        {"ready": True, "platform": FOREIGN, "bundle_platform": "any", "digest": "a" * 64}, "proxy"
    )
    assert ok["ready"] is True
    for bad in ({"bundle_platform": "cpython-312-x86_64-linux-gnu"}, {"digest": "../x"},
                {"platform": "/abs"}, {"ready": "yes"}, {"version": "3.12.1"}):  # fmt: skip
        got = vet({"ready": True, "platform": FOREIGN, **bad}, "proxy")
        assert got["ready"] is False, bad
    assert vet({"problem": "\x1b]0;owned\x07x"}, "proxy")["problem"] == "?]0;owned?x"
    assert vet({"ready": True, "digest": "a" * 64}, "proxy")["ready"] is False  # no platform


# -- a wheel a host built is verified, packed again, and spread only where the profile says ----


def test_an_honest_host_build_is_packed_again_from_the_controllers_files() -> None:
    v = verify_host_wheel(
        host_wheel(), f"kvpd-0.1.0-{TAG}.whl", FOREIGN, wheels.reference_members()
    )
    assert v.native
    assert v.name == f"kvpd-0.1.0-{TAG}.whl"
    assert verify_host_wheel(v.data, v.name, FOREIGN, wheels.reference_members()).data == v.data


TROJANS = {
    "a .pth file": {"kvpd-evil.pth": b"import os; os.system('id')\n"},
    "sitecustomize": {"sitecustomize.py": b"import os\n"},
    "usercustomize": {"kvpd/usercustomize.py": b"import os\n"},
    "a .data folder": {"kvpd-0.1.0.data/scripts/kvpd": b"#!/bin/sh\nid\n"},
    "a changed module": {"kvpd/__init__.py": b"import os; os.system('id')\n"},
    "changed entry points": {"kvpd-0.1.0.dist-info/entry_points.txt": b"[x]\nx = os:system\n"},
    "a second extension": {"kvpd/native/_evil.cpython-311-aarch64-linux-gnu.so": b"\x7fELF"},
    "an extension that is no ELF": {native_member(FOREIGN): b"#!/bin/sh\n"},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(TROJANS))
def test_a_trojaned_host_build_is_refused(kind: str) -> None:
    with pytest.raises(Refused):
        verify_host_wheel(host_wheel(TROJANS[kind]), f"kvpd-0.1.0-{TAG}.whl", FOREIGN,
                          wheels.reference_members())  # fmt: skip


def test_a_host_build_with_a_forged_record_or_tag_is_refused() -> None:
    ref = wheels.reference_members()
    good = host_wheel()
    with pytest.raises(Refused, match="tagged cp312"):
        verify_host_wheel(
            host_wheel(tag="cp312-cp312-linux_aarch64"),
            "kvpd-0.1.0-cp312-cp312-linux_aarch64.whl",
            FOREIGN,
            ref,
        )
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as src, zipfile.ZipFile(buf, "w") as dst:
        for i in src.infolist():
            data = src.read(i)
            if i.filename.endswith("RECORD"):
                data += b"kvpd-evil.pth,,\n"
            dst.writestr(i, data)
    with pytest.raises(Refused, match="RECORD"):
        verify_host_wheel(buf.getvalue(), f"kvpd-0.1.0-{TAG}.whl", FOREIGN, ref)


def test_a_trojaned_build_is_neither_cached_nor_installed(cache: Path, tmp_path: Path) -> None:
    """Regression: the wheel a node built was cached and installed as it came, so one
    compromised node owned every peer of its platform."""
    liar = Liar(facts(FOREIGN), {"wheel": f"/x/kvpd-0.1.0-{TAG}.whl", "native": True},
                host_wheel(TROJANS["a .pth file"]))  # fmt: skip
    inst, _ = run_liar(tmp_path, liar)
    assert any("was refused" in w and "kvpd-evil.pth" in w for w in inst.warnings), inst.warnings
    assert wheels.cached(FOREIGN, built_on="evil") is None
    assert not list(cache.rglob(f"*{TAG}*"))
    uploads = [p for p in liar.puts if "/.incoming/" in p]
    assert uploads
    assert all(p.endswith("py3-none-any.whl") for p in uploads)  # the controller's own


class NoCompiler:
    """This machine as a host without a C++ compiler (fault injection: its check's answer is
    changed to say so; everything else runs for real)."""

    def __init__(self, t: LocalTransport) -> None:
        self.t, self.host = t, t.host

    def run(self, argv: list[str], **kw: Any) -> CommandResult:
        r = self.t.run(argv, **kw)
        if argv[:3] != ["bash", "-c", CHECK_SH]:
            return r
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        out = "".join(json.dumps({**d, "compiler": False}) + "\n" for d in lines)
        return replace(r, stdout=out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.t, name)


def test_a_host_build_serves_only_its_builder_unless_the_profile_says(
    cache: Path, tmp_path: Path
) -> None:
    """Regression: a wheel one node built was installed on every node of its platform. Now it
    serves the host that built it; marked `bundle_builder`, it serves the others too."""
    plan = plan_of(tmp_path, "h1", "h2")
    for h in ("h1", "h2"):
        (tmp_path / h).mkdir()
    ts = {"h1": LocalTransport(plan.hosts[0]), "h2": NoCompiler(LocalTransport(plan.hosts[1]))}
    pure = lambda **kw: wheels.build_local(native=False)  # noqa: E731
    run_dirs = {h: str(tmp_path / h) for h in ts}
    inst = BundleInstaller(ts.__getitem__, build_local=pure, local_platform="cpython-399-fake")
    got = {r.host: r for r in inst.install(plan, run_dirs)}
    assert got["h1"].source == "host:h1"
    assert got["h1"].report["native"]["implementation"] == "native"
    assert got["h2"].source == "any"
    assert got["h2"].report["native"]["implementation"] == "numpy"
    assert any("bundle_builder: true" in w for w in inst.warnings), inst.warnings

    shared = plan_of(tmp_path, "h1", "h2", builders=("h1",))
    seen: list[str] = []

    class Rows(NullReporter):
        def process(self, name: str, phase: str, **kw: object) -> None:
            seen.append(f"{phase} {kw.get('detail')}")

    inst = BundleInstaller(
        ts.__getitem__, Rows(), build_local=pure, local_platform="cpython-399-fake"
    )
    again = {r.host: r for r in inst.install(shared, run_dirs)}
    assert again["h1"].action == "kept"
    assert again["h1"].source == "cache:host:h1"
    assert again["h2"].action == "installed"
    assert again["h2"].source == "cache:host:h1"
    # what `up` shows per host, and `status` from the state record
    assert any("healthy" in x and "wheel: cached host build on h1" in x for x in seen), seen
    # h1 no longer a builder: h2 does not keep h1's build
    inst = BundleInstaller(ts.__getitem__, build_local=pure, local_platform="cpython-399-fake")
    last = {r.host: r for r in inst.install(plan, run_dirs)}
    assert last["h1"].action == "kept"
    assert last["h1"].source == "cache:host:h1"
    assert last["h2"].action == "installed", last["h2"].report
    assert last["h2"].source == "any", last["h2"].report
    row = again["h2"].recorded()
    assert row.source == "cache:host:h1"
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(status_table([row]))
    assert "cached host build on h1" in console.export_text()


def test_preflight_says_where_each_platforms_wheel_comes_from(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_of(tmp_path, "h1", "h2")
    for h in ("h1", "h2"):
        (tmp_path / h).mkdir()
    ts = {"h1": LocalTransport(plan.hosts[0]), "h2": NoCompiler(LocalTransport(plan.hosts[1]))}
    here = wheels.local_platform()

    def native(p: Plan) -> Check:
        return next(c for c in preflight_checks(p, ts.__getitem__) if c.name.startswith("native"))

    assert native(plan).detail == "controller build (h1, h2)"
    monkeypatch.setattr(wheels, "local_platform", lambda: "cpython-399-fake")
    c = native(plan)
    assert c.ok
    assert c.name == f"native core {here}"
    assert (
        c.detail
        == "host build on each of h1 for itself; warning: no compiler on h2: NumPy fallback"
    )
    assert "set `bundle_builder: true` on h1" in c.fix
    c = native(plan_of(tmp_path, "h1", "h2", builders=("h1",)))
    assert c.ok
    assert c.detail == "host build on h1 for h1, h2"


# -- the wheel cache: nobody else can plant into it ---------------------------------------------


def test_cache_folders_are_private_and_checked(cache: Path) -> None:
    w = wheels.build_local(native=False)
    d = w.path.parent
    for p in (cache, cache / "wheels", d.parent, d):
        assert (p.stat().st_mode & 0o777) == 0o700, p
    assert (w.path.stat().st_mode & 0o777) == 0o600
    (cache / "wheels").chmod(0o770)
    with pytest.raises(UnsafeCache, match="writable by group or others.*chmod go-w"):
        wheels.cached(wheels.ANY)
    (cache / "wheels").chmod(0o700)
    assert wheels.cached(wheels.ANY) == w
    w.path.chmod(0o666)
    with pytest.raises(UnsafeCache, match="writable by group or others"):
        wheels.cached(wheels.ANY)


def test_a_planted_link_in_the_cache_is_refused_and_never_written_through(
    cache: Path, tmp_path: Path
) -> None:
    """Regression: the cache wrote through whatever link sat at a wheel's or record's name."""
    w = wheels.build_local(native=False)
    data, d = w.path.read_bytes(), w.path.parent
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in (w.name, "wheel.json", "wheel.json.tmp"):
        (d / name).unlink(missing_ok=True)
        (d / name).symlink_to(victim)
    with pytest.raises(UnsafeCache, match="cannot be read safely"):
        wheels.cached(wheels.ANY)
    wheels.store(wheels.ANY, w.name, data, False, "pure")
    assert victim.read_text() == "precious\n"
    (d.parent / "elsewhere").mkdir()
    (d.parent / FOREIGN).symlink_to(d.parent / "elsewhere")
    with pytest.raises(UnsafeCache, match="symbolic link"):
        wheels.cached(FOREIGN, built_on="h1")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_cache_folder_of_another_user_is_refused(cache: Path) -> None:
    w = wheels.build_local(native=False)
    os.chown(w.path.parent, 65534, -1)
    with pytest.raises(UnsafeCache, match="belongs to uid 65534"):
        wheels.cached(wheels.ANY)


def test_a_cached_wheel_is_checked_again_right_before_it_is_sent(cache: Path) -> None:
    w = wheels.build_local(native=False)
    assert wheels.wheel_bytes(w) == w.path.read_bytes()
    w.path.write_bytes(w.path.read_bytes() + b"x")
    with pytest.raises(UnsafeCache, match="changed after kvpd checked it"):
        wheels.wheel_bytes(w)
    assert wheels.cached(wheels.ANY) is None  # and it is not taken from the cache again


# -- the installed bundle is exactly the wheel --------------------------------------------------


def installed(tmp_path: Path) -> tuple[Plan, LocalTransport, dict[str, str], Path]:
    plan = plan_of(tmp_path, "here")
    (tmp_path / "here").mkdir()
    t = LocalTransport(plan.hosts[0])
    run_dirs = {"here": str(tmp_path / "here")}
    pure = lambda **kw: wheels.build_local(native=False)  # noqa: E731
    first = BundleInstaller(lambda h: t, build_local=pure).install(plan, run_dirs)[0]
    assert first.action == "installed", first.report
    return plan, t, run_dirs, Path(first.report["folder"])


@pytest.mark.parametrize("planted", ["kvpd-evil.pth", "kvpd/proxy/evil.py", "sitecustomize.py"])
def test_a_file_not_in_the_record_makes_the_bundle_damaged(
    cache: Path, tmp_path: Path, planted: str
) -> None:
    """Regression: the check verified only the files the RECORD lists, so a planted `.pth` or
    module sat next to a bundle that passed."""
    plan, t, run_dirs, folder = installed(tmp_path)
    (folder / planted).write_text("import os\n")
    pure = lambda **kw: wheels.build_local(native=False)  # noqa: E731
    again = BundleInstaller(lambda h: t, build_local=pure).install(plan, run_dirs)[0]
    assert again.action == "installed", again.report  # repaired, not kept
    assert not (folder / planted).exists()


def test_bytecode_in_the_bundle_is_dropped_not_trusted(cache: Path, tmp_path: Path) -> None:
    """A `.pyc` beside a verified source is used by Python without looking at the source's
    content: the check removes every bytecode cache, and writes none itself."""
    plan, t, run_dirs, folder = installed(tmp_path)
    assert not list(folder.rglob("__pycache__"))  # pip --no-compile, the check runs with -B
    pyc = folder / "kvpd" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"planted")
    pure = lambda **kw: wheels.build_local(native=False)  # noqa: E731
    again = BundleInstaller(lambda h: t, build_local=pure).install(plan, run_dirs)[0]
    assert again.action == "kept", again.report
    assert not pyc.exists()
    assert not list(folder.rglob("__pycache__"))


def test_pip_runs_isolated_from_the_users_configuration(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the user's pip configuration (here `user = true`, which pip refuses with
    --target) and PIP_* variables reached the install."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[install]\nuser = true\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    installed(tmp_path)


def test_an_install_report_of_another_wheel_is_not_trusted(cache: Path, tmp_path: Path) -> None:
    liar = Liar(facts(FOREIGN), {}, b"")
    liar.report["compiler"] = False
    liar.installed = {"ready": True, "platform": FOREIGN, "digest": "b" * 64, "native": {}}
    _, (err,) = run_liar(tmp_path, liar)
    assert "reported the bundle " + "b" * 64 + " instead of" in str(err)
