"""The node bundle: who gets it (plan), which wheel per platform, install/verify/reuse on a host.

The install tests run the real step on this machine (LocalTransport, this Python's pip) into a
temporary run dir, with the wheel cache in a temporary folder.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvpd.errors import DeployError
from kvpd.exec.bundle import wheel as wheels
from kvpd.exec.bundle.installer import Build, BundleInstaller, choose_builds
from kvpd.exec.bundle.result import BundleSlot, SlotResult
from kvpd.exec.local import LocalTransport
from kvpd.exec.purge import unsafe_run_dir
from kvpd.exec.report import NullReporter
from kvpd.plan.build import load_plan
from kvpd.plan.bundle import BundleUse, native_need, sparse_planner
from kvpd.plan.value import HostSpec, Plan

# -- the plan (pure) -----------------------------------------------------------------------------


def test_local_plan_bundles_engines_and_proxy_only() -> None:
    plan = load_plan("local", base_dir="/srv")
    slots = {(u.host, u.slot): u for u in plan.bundle}
    assert set(slots) == {("localhost", "engine"), ("localhost", "proxy")}
    eng = slots[("localhost", "engine")]
    assert eng.python == "@vllm"  # the engine's own interpreter
    assert eng.processes == ("prefill-0", "decode-0")
    assert eng.why == ("prefill-0: kv connector kvpd_store", "decode-0: kv connector kvpd_store")
    assert slots[("localhost", "proxy")].python == "python3"
    scripts = {f.path: f.content for f in plan.files}
    line = 'export PYTHONPATH="$PWD"/bundle/engine${PYTHONPATH:+:"$PYTHONPATH"}'
    assert line in scripts["prefill-0/launch.sh"]
    assert "bundle/proxy" in scripts["proxy/launch.sh"]
    assert plan.process("proxy").command[:3] == ("python3", "-m", "kvpd.proxy")
    assert Plan.from_dict(json.loads(plan.to_json())).bundle == plan.bundle


def test_engines_without_kvpd_connectors_get_no_bundle() -> None:
    plan = load_plan("ucm-centralized-2p2d", base_dir="/srv")
    assert [(u.host, u.slot) for u in plan.bundle] == [("p1", "proxy")]
    for f in plan.files:
        if not f.path.startswith("proxy/"):
            assert "PYTHONPATH" not in f.content, f.path


def test_vllm_ascend_proxy_and_no_kvpd_store_means_no_bundle() -> None:
    plan = load_plan("ucm-centralized-2p2d", base_dir="/srv", sets=["proxy.impl=vllm-ascend"])
    assert plan.bundle == ()


def test_rehearsal_engines_with_a_kv_connector_get_kvpds_example_connector_from_the_bundle() -> (
    None
):
    plan = load_plan("local", rehearse=True, base_dir="/srv")
    assert [u.slot for u in plan.bundle] == ["engine", "proxy"]
    engine = next(u for u in plan.bundle if u.slot == "engine")
    assert all("rehearsal KV connector" in why for why in engine.why), engine.why
    argv = " ".join(plan.process("prefill-0").command)
    assert '"kv_connector_module_path": "kvpd.connectors.example_rehearsal"' in argv
    # The stand-in engine needs no connector of kvpd's.
    standin = load_plan("local", rehearse="standin", base_dir="/srv")
    assert [u.slot for u in standin.bundle] == ["proxy"]


def test_proxy_python_from_the_profile() -> None:
    plan = load_plan("local", base_dir="/srv", sets=["proxy.python=/opt/py312/bin/python3"])
    proxy = next(u for u in plan.bundle if u.slot == "proxy")
    assert proxy.python == "/opt/py312/bin/python3"
    assert plan.process("proxy").command[0] == "/opt/py312/bin/python3"


def test_planner_predicate_reads_the_planner_field_when_it_exists() -> None:
    """Hook for `decode.sparse_offload.planner` (added elsewhere): without the field a group
    reads as upstream; with it, kvpd requires and auto prefers the native core."""
    plain = SimpleNamespace(sparse_offload=SimpleNamespace(enabled=True))
    assert sparse_planner(plain) == "upstream"
    assert native_need(plain) == "optional"
    for planner, need in (("kvpd", "required"), ("auto", "preferred"), ("upstream", "optional")):
        g = SimpleNamespace(sparse_offload=SimpleNamespace(enabled=True, planner=planner))
        assert native_need(g) == need
    assert sparse_planner(SimpleNamespace(sparse_offload=None)) is None


# -- the per-platform choice, from what hosts report ---------------------------------------------

LOCAL = "cpython-311-x86_64-linux-gnu"


def test_choose_builds_per_platform() -> None:
    """A host's build serves only that host unless the host is a `bundle_builder`: then one
    build (or its cached wheel) serves every host of its platform."""
    x312, a311, x310 = (f"cpython-{v}-linux-gnu" for v in ("312-x86_64", "311-aarch64", "310-i686"))
    missing = {
        LOCAL: [("h1", False), ("h2", True)],
        x312: [("h3", False), ("h4", True), ("h5", True), ("h4", True)],
        a311: [("a1", False), ("a2", False)],
        x310: [("h6", True), ("h7", False)],
    }
    got = choose_builds(missing, LOCAL, cached={(x310, "h6")})
    assert got == {
        (LOCAL, None): Build("local"),  # the controller's own wheel, even without compiler
        (x312, "h4"): Build("hosts", ("h4",)),  # each able host builds its own
        (x312, "h5"): Build("hosts", ("h5",)),
        (x312, None): Build("any"),  # h3: no compiler, no builder: NumPy fallback
        (a311, None): Build("any"),
        (x310, "h6"): Build("cache", ("h6",)),  # its own build, from before
        (x310, None): Build("any"),  # h7 does not get h6's build
    }
    shared = choose_builds(missing, LOCAL, {(x310, "h6")}, {x312: ("h5",), x310: ("h6",)})
    assert shared[(x312, None)] == Build("hosts", ("h5",))  # the builder, for h3, h4, h5
    assert shared[(x310, None)] == Build("cache", ("h6",))  # the builder's cached build
    assert set(shared) == {(LOCAL, None), (x312, None), (a311, None), (x310, None)}


def test_choose_builds_prefers_the_controllers_cross_build_to_a_host_build() -> None:
    # A wheel the controller builds itself needs no compiler on the hosts, and no wheel built
    # on one host is installed on another (not even a builder's, nor its cached build).
    arm, arm312 = "cpython-311-aarch64-linux-gnu", "cpython-312-aarch64-linux-gnu"
    missing = {arm: [("a1", True)], arm312: [("a2", True)], LOCAL: [("h1", False)]}
    got = choose_builds(
        missing, LOCAL, cached={(arm312, "a2")}, builders={arm: ("a1",)},
        cross=frozenset({arm, arm312}),
    )  # fmt: skip
    assert got == {
        (arm, None): Build("cross"),
        (arm312, None): Build("cross"),
        (LOCAL, None): Build("local"),
    }


# -- install, verify, reuse on this machine ------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("kvpd-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("KVPD_CACHE_DIR", str(d))
    yield d
    mp.undo()


def pure(**kw: object) -> wheels.Wheel:
    """The controller's wheel without the native core: no compile in the tests that do not need
    one (test_foreign_platform_is_built_on_its_host compiles it, on its "host")."""
    return wheels.build_local(native=False)


def one_host_plan(run_dir: Path, python: str = sys.executable, native: str = "optional") -> Plan:
    host = HostSpec(name="here", address="127.0.0.1", transport="local", run_dir=str(run_dir))
    use = BundleUse("here", "proxy", python, ("proxy",), ("proxy: kvpd proxy",), native)
    return Plan("t", "0", (host,), (), (), bundle=(use,))


def test_install_then_reuse_then_repair(cache: Path, tmp_path: Path) -> None:
    plan = one_host_plan(tmp_path / "run")
    (tmp_path / "run").mkdir()
    t = LocalTransport(plan.hosts[0])
    inst = BundleInstaller(lambda h: t, build_local=pure)
    first = inst.install(plan, {"here": str(tmp_path / "run")})[0]
    assert first.action == "installed", first.report
    assert first.source == "local", first.report
    rep = first.report
    folder = Path(rep["folder"])
    assert folder.parent == tmp_path / "run" / "bundle"
    assert folder.name == rep["digest"][:16]  # keyed by the wheel's digest
    assert (tmp_path / "run" / "bundle" / "proxy").resolve() == folder
    assert rep["native"]["implementation"] == "numpy"  # the pure wheel: NumPy fallback
    assert rep["native"]["reason"] == "the bundle has no native core for this platform"
    assert (folder / "kvpd" / "proxy" / "app.py").exists()

    again = BundleInstaller(lambda h: t, build_local=pure).install(
        plan, {"here": str(tmp_path / "run")}
    )[0]
    assert again.action == "kept"
    assert again.report["digest"] == rep["digest"]

    (folder / "kvpd" / "proxy" / "app.py").write_text("# tampered\n")
    fixed = BundleInstaller(lambda h: t, build_local=pure).install(
        plan, {"here": str(tmp_path / "run")}
    )[0]
    assert fixed.action == "installed", fixed.report
    assert "tampered" not in (folder / "kvpd" / "proxy" / "app.py").read_text()


def test_a_bundle_named_after_its_slot_link_in_sort_order_is_kept(
    cache: Path, tmp_path: Path
) -> None:
    """Regression (CI, 1 run in 16): the slot link `bundle/engine` was listed as a bundle of its
    own. When the digest folder sorted after "engine" (a digest starting with "f"), the check of
    a second `up` took the link, pointed the slot at itself, and every engine of that host
    failed with "No module named 'kvpd'"."""
    run = tmp_path / "run"
    run.mkdir()
    plan = one_host_plan(run)
    plan = replace(plan, bundle=(replace(plan.bundle[0], slot="engine"),))
    t = LocalTransport(plan.hosts[0])
    first = BundleInstaller(lambda h: t, build_local=pure).install(plan, {"here": str(run)})[0]
    assert first.ok, first.report
    base = run / "bundle"
    old = Path(first.report["folder"])
    late = base / ("f" * 16)  # sorts after "engine"
    old.rename(late)
    marker = json.loads((late / ".kvpd-bundle.json").read_text())
    (late / ".kvpd-bundle.json").write_text(json.dumps({**marker, "digest": "f" * 64}))
    (base / "engine").unlink()
    (base / "engine").symlink_to(late.name)
    for _ in range(2):
        again = BundleInstaller(lambda h: t, build_local=pure).install(plan, {"here": str(run)})
        assert again[0].action == "kept", again[0].report
        assert again[0].report["folder"] == str(late)
        assert (base / "engine").resolve() == late
        assert (base / "engine" / "kvpd" / "__init__.py").is_file()


def test_missing_interpreter_is_an_actionable_error(cache: Path, tmp_path: Path) -> None:
    plan = one_host_plan(tmp_path / "run", python="/nonexistent/python3")
    (tmp_path / "run").mkdir()
    t = LocalTransport(plan.hosts[0])
    with pytest.raises(DeployError) as e:
        BundleInstaller(lambda h: t, build_local=pure).install(
            plan, {"here": str(tmp_path / "run")}
        )
    msg = str(e.value)
    assert "here (proxy: /nonexistent/python3): interpreter not found" in msg
    assert "set its full path in the profile" in msg


def test_required_native_core_without_it_fails(cache: Path, tmp_path: Path) -> None:
    plan = one_host_plan(tmp_path / "run", native="required")
    (tmp_path / "run").mkdir()
    t = LocalTransport(plan.hosts[0])
    inst = BundleInstaller(lambda h: t, build_local=pure)
    with pytest.raises(DeployError, match="the kvpd planner needs the native core"):
        inst.install(plan, {"here": str(tmp_path / "run")})


def test_pure_wheel_is_deterministic(cache: Path, tmp_path: Path, monkeypatch) -> None:
    a = wheels.build_local(native=False)
    monkeypatch.setenv("KVPD_CACHE_DIR", str(tmp_path))
    b = wheels.build_local(native=False)
    assert a.digest == b.digest
    assert a.path != b.path


def test_purge_refuses_system_folders() -> None:
    for bad in ("/", "/root", "/home", "/home/alice", "/srv", "relative/run"):
        assert unsafe_run_dir(bad), bad
    assert unsafe_run_dir("/root/.kvpd/local/run") is None
    assert unsafe_run_dir("/home/alice/.kvpd/x/run") is None


def test_plan_replace_keeps_bundle() -> None:
    plan = load_plan("local", base_dir="/srv")
    assert replace(plan, warnings=()).bundle == plan.bundle


def test_foreign_platform_is_built_on_its_host(tmp_path: Path, monkeypatch) -> None:
    """The controller pretends another platform, so this machine plays a host whose platform
    differs: the wheel is built there (upload, build, fetch back, cache) and installed."""
    monkeypatch.setenv("KVPD_CACHE_DIR", str(tmp_path / "cache"))
    plan = one_host_plan(tmp_path / "run")
    (tmp_path / "run").mkdir()
    t = LocalTransport(plan.hosts[0])
    res = BundleInstaller(lambda h: t, local_platform="cpython-399-fake").install(
        plan, {"here": str(tmp_path / "run")}
    )[0]
    assert res.action == "installed", res.report
    assert res.source == "host:here", res.report
    assert res.report["native"]["implementation"] == "native"
    # cached as that host's own build: its next `up` reuses it, no other host gets it
    assert wheels.cached(res.report["platform"], built_on="here") is not None
    assert wheels.cached(res.report["platform"]) is None
    assert not (tmp_path / "run" / "bundle" / f".build-{wheels.source_digest()[:16]}").exists()


def test_preflight_checks_each_slot_python(cache: Path, tmp_path: Path) -> None:
    from kvpd.exec.bundle.preflight import preflight_checks

    good = one_host_plan(tmp_path / "run")
    t = LocalTransport(good.hosts[0])
    checks = {c.name: c for c in preflight_checks(good, lambda h: t)}
    assert checks["bundle python (proxy)"].ok
    assert checks["pip (proxy)"].ok
    assert checks["disk for bundle (proxy)"].ok
    assert checks[f"native core {wheels.local_platform()}"].ok

    bad = one_host_plan(tmp_path / "run", python="/nonexistent/python3")
    checks = {c.name: c for c in preflight_checks(bad, lambda h: t)}
    c = checks["bundle python (proxy)"]
    assert not c.ok
    assert "interpreter not found" in c.detail
    assert "full path" in c.fix


def test_preflight_reports_a_host_it_cannot_reach_as_a_failed_check(
    cache: Path, tmp_path: Path
) -> None:
    # Reaching the host (its transport, its host key, its run dir) is part of the check: the
    # failure is that host's check, with the transport's words, not an error out of preflight.
    from kvpd.exec.bundle.preflight import preflight_checks

    plan = one_host_plan(tmp_path / "run")

    def unreachable(host: str) -> LocalTransport:
        raise RuntimeError(f"host {host}: unknown host key ssh-ed25519 SHA256:abc")

    checks = {c.name: c for c in preflight_checks(plan, unreachable)}
    c = checks["bundle python (proxy)"]
    assert not c.ok
    assert "unknown host key ssh-ed25519 SHA256:abc" in c.detail


def test_install_removes_unlinked_bundles_of_other_sources(cache: Path, tmp_path: Path) -> None:
    base = tmp_path / "run" / "bundle"
    for name in ("old-unlinked", "old-linked"):
        (base / name).mkdir(parents=True)
        (base / name / ".kvpd-bundle.json").write_text(json.dumps({"source": "older kvpd"}))
    (base / "engine").symlink_to("old-linked")  # another slot still runs the old one
    (base / "not-a-bundle").mkdir()
    plan = one_host_plan(tmp_path / "run")
    t = LocalTransport(plan.hosts[0])
    res = BundleInstaller(lambda h: t, build_local=pure).install(plan, {"here": str(base.parent)})
    assert res[0].action == "installed"
    left = sorted(p.name for p in base.iterdir())
    assert left == sorted(
        ["old-linked", "engine", "not-a-bundle", "proxy", res[0].report["digest"][:16]]
    )


def test_wheel_metadata_carries_the_entry_points_of_pyproject(tmp_path: Path, monkeypatch) -> None:
    """vLLM finds general plugins by entry point: the bundle's dist-info must carry them (the
    bundle folder is on PYTHONPATH, so importlib.metadata sees it). The console script is left
    out: it needs the orchestrator's dependencies."""
    py = tmp_path / "pyproject.toml"
    py.write_text(
        '[project]\nname = "kvpd"\n[project.scripts]\nkvpd = "kvpd.cli.main:main"\n'
        '[project.entry-points."vllm.general_plugins"]\nkvpd_planner = "kvpd.plugin:register"\n'
    )
    monkeypatch.setattr(wheels, "_pyproject", lambda: py)
    info = wheels._dist_info()
    assert info["entry_points.txt"].decode() == (
        "[vllm.general_plugins]\nkvpd_planner = kvpd.plugin:register\n\n"
    )
    assert b"Requires-Dist" not in info["METADATA"]


def test_plan_shows_who_gets_the_bundle_and_why() -> None:
    from kvpd.cli.bundle_view import plan_lines

    lines = plan_lines(load_plan("local", base_dir="/srv"))
    assert lines[1] == (
        "  localhost (engine slot, python of `vllm`): prefill-0: kv connector kvpd_store; "
        "decode-0: kv connector kvpd_store"
    )
    assert lines[2] == "  localhost (proxy slot, python3): proxy: kvpd proxy"
    assert plan_lines(load_plan("ucm-pd-mixed", base_dir="/srv")) == []
    shared = load_plan("local", base_dir="/srv", sets=["hosts.localhost.bundle_builder=true"])
    assert plan_lines(shared)[2].endswith("; its wheel build serves its platform's hosts")
    assert next(h for h in shared.to_dict()["hosts"])["bundle_builder"] is True


def test_fallback_warning_says_how_to_get_the_native_core() -> None:
    """The warning says what brings the native core: a compiler on a host of that platform (the
    next `up` upgrades), or, when a build was tried and failed, clearing that failure."""
    from kvpd.cli.bundle_view import fallback_warning

    row = BundleSlot(
        host="d1",
        slot="engine",
        python="@vllm",
        platform="cpython-311-aarch64-linux-gnu",
        implementation="numpy",
        native={"reason": "the bundle has no native core for this platform"},
        compiler=False,
    )
    w = fallback_warning(row, "prod.yaml")
    assert w is not None
    assert w.startswith("d1: kvpd's native core is not available")
    assert "Install g++ and the Python headers" in w
    assert "the next `kvpd up` builds the core and replaces the fallback" in w
    assert "scripts/install-aarch64.sh" in w
    assert "cross-builds the core here" in w
    x86 = fallback_warning(replace(row, platform="cpython-311-x86_64-linux-gnu"), "prod.yaml")
    assert x86 is not None
    assert "install-aarch64" not in x86
    failed = fallback_warning(replace(row, compiler=True), "prod.yaml")
    assert failed is not None
    assert "failed before and is not retried" in failed
    assert "wheels/*/cpython-311-aarch64-linux-gnu" in failed
    assert "`kvpd up prod.yaml`" in failed
    assert fallback_warning(replace(row, implementation="native"), "p") is None
    assert fallback_warning(replace(row, slot="proxy"), "p") is None


def fallback_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Plan, LocalTransport, SlotResult]:
    """A run dir whose proxy slot holds the wheel without the native core, in a wheel cache of
    the test's own: (run dir, plan, transport, the install's result)."""
    monkeypatch.setenv("KVPD_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    plan = one_host_plan(run)
    t = LocalTransport(plan.hosts[0])
    first = BundleInstaller(lambda h: t, build_local=pure).install(plan, {"here": str(run)})[0]
    return run, plan, t, first


def test_a_fallback_bundle_is_upgraded_once_the_native_core_can_be_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot that got the wheel without the native core (no build was possible then) gets the
    native one on a later `up` once it can be had (here: the controller now builds it), and the
    `up` after that keeps it."""
    run, plan, t, first = fallback_installed(tmp_path, monkeypatch)
    assert first.report["bundle_platform"] == wheels.ANY
    assert first.report["native"]["implementation"] == "numpy"
    again = BundleInstaller(lambda h: t, build_local=pure).install(plan, {"here": str(run)})[0]
    assert again.action == "kept"  # still no native wheel to be had: nothing reinstalled
    seen: list[tuple[str, str]] = []

    class Phases(NullReporter):
        def process(self, name: str, phase: str, **kw: object) -> None:
            seen.append((phase, str(kw.get("detail", ""))))

    up = BundleInstaller(lambda h: t, Phases()).install(plan, {"here": str(run)})[0]
    assert up.action == "installed", up.report
    assert up.source == "local", up.report
    # the host's row ends healthy, once, with the upgrade (not first "kept", then "installed")
    assert [p for p, _ in seen if p == "healthy"] == ["healthy"]
    assert seen[-1][0] == "healthy", seen
    assert "proxy: installed" in seen[-1][1], seen
    assert up.report["native"]["implementation"] == "native"
    assert (run / "bundle" / "proxy").resolve() == Path(up.report["folder"])
    last = BundleInstaller(lambda h: t).install(plan, {"here": str(run)})[0]
    assert last.action == "kept"
    assert last.report["digest"] == up.report["digest"]


def test_a_failed_native_build_is_not_retried_on_every_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For a platform other than the controller's, a cached wheel without the native core
    records that a build was tried for this kvpd source: the fallback slot is kept, nothing is
    built or reinstalled."""
    run, plan, t, first = fallback_installed(tmp_path, monkeypatch)
    w = pure()
    wheels.store(first.report["platform"], w.name, w.path.read_bytes(), False, "failed", "here")
    inst = BundleInstaller(lambda h: t, local_platform="cpython-399-fake")
    res = inst.install(plan, {"here": str(run)})[0]
    assert res.action == "kept", res.report
    assert res.report["digest"] == first.report["digest"], res.report
    assert not inst.warnings


def test_preflight_says_a_cross_buildable_platform_is_the_controllers_cross_build() -> None:
    from kvpd.exec.bundle.preflight import _native_check

    arm = "cpython-311-aarch64-linux-gnu"
    facts = {"hosts": ["a1", "a2"], "builders": [], "required": ["a1"]}
    check = _native_check(arm, facts, LOCAL, set(), frozenset({arm}))
    assert check.ok
    assert check.detail == "controller cross-build (a1, a2)"
    without = _native_check(arm, facts, LOCAL, set(), frozenset())
    assert not without.ok
    assert "NumPy fallback" in without.detail  # required, no compiler


def test_preflight_says_why_there_is_no_cross_build_and_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvpd.exec.bundle.preflight import _native_check

    monkeypatch.setenv("PATH", str(tmp_path))  # no aarch64-linux-gnu-g++ on this controller
    arm = "cpython-311-aarch64-linux-gnu"
    facts = {"hosts": ["a1"], "builders": [], "required": []}
    check = _native_check(arm, facts, LOCAL, set(), frozenset())
    assert check.ok  # a warning: nothing requires the native core there
    assert check.detail == (
        "warning: no compiler on a1: NumPy fallback "
        "(no controller cross-build: no aarch64-linux-gnu-g++ on the controller)"
    )
    assert "scripts/install-aarch64.sh" in check.fix
    assert "python3-dev" in check.fix


def test_preflight_names_a_cached_wheel_as_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvpd.exec.bundle import preflight as bundle_preflight

    platform = "cpython-399-fake"
    monkeypatch.setattr(
        bundle_preflight, "_cached_native", lambda p, host: (p, host) == (platform, "h1")
    )
    facts = {"hosts": ["h1", "h2"], "builders": ["h2"], "required": []}
    check = bundle_preflight._native_check(platform, facts, LOCAL, set())
    assert check.ok
    assert check.detail == ("cached wheel built on h1 for h1; host build on each of h2 for itself")
    shared = bundle_preflight._native_check(platform, {**facts, "builders": []}, LOCAL, {"h1"})
    assert shared.detail == "cached wheel built on h1 for h1; cached wheel built on h1 for h2"
