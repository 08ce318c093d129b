"""The node side of the bundle step: runs on a host, in the Python of one slot, as a script.

    python -I -S -B -c "$(cat node.py)" check   RUN_DIR SLOT SOURCE
    python -I -B -c "$(cat node.py)" install RUN_DIR SLOT SOURCE WHEEL DIGEST PLATFORM
    python -I -S -B -c "$(cat node.py)" facts   RUN_DIR SLOT -

`check` looks for a bundle of SOURCE (kvpd.exec.bundle.wheel.source_digest) for this Python's
platform in RUN_DIR/bundle/<digest>/, verifies the installed tree against the RECORD, imports kvpd
from it (and only from it), points RUN_DIR/bundle/SLOT at it and prints one JSON line with what it
found: the interpreter, its platform, pip, a compiler, free disk and the native implementation.
`install` installs the uploaded WHEEL with this Python's pip (no dependencies, no index) into a new
folder named by the wheel's digest, then does `check`.

Standard library only and no syntax newer than Python 3.6: it must be able to say "too old" on
any interpreter it meets. Nothing outside RUN_DIR/bundle is written.
"""
# ruff: noqa: UP022, UP031, UP036  (Python 3.6 syntax on purpose, see above)

import binascii
import hashlib
import json
import os
import sys
import sysconfig

# subprocess and shutil are imported where an install needs them: a re-`up` runs only `check`,
# on every host, and its start-up time is most of that step's cost.

MARKER = ".kvpd-bundle.json"
# What each slot's processes import first: verified before they start.
SLOT_IMPORTS = {"engine": ("kvpd.native",), "proxy": ("kvpd.proxy.app",)}
ANY = "any"


def platform_key():
    return str(sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag)


def which(cmd):
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if d and os.access(os.path.join(d, cmd), os.X_OK):
            return os.path.join(d, cmd)
    return None


def b64(digest):
    """urlsafe base64 without padding, as in a wheel's RECORD (binascii: base64 imports re)."""
    text = binascii.b2a_base64(digest, newline=False).decode()
    return text.replace("+", "-").replace("/", "_").rstrip("=")


def facts(run_dir):
    base = os.path.join(run_dir, "bundle")
    inc = sysconfig.get_paths().get("include") or ""
    cxx = any(which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++"))
    probe = base if os.path.isdir(base) else run_dir
    while probe and not os.path.isdir(probe):
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe or "/")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    # Run with -S (no site: faster), so pip is looked for where site would find it (Debian's
    # site knows its dist-packages folders).
    import site

    paths = sysconfig.get_paths()
    dirs = [paths.get("purelib") or "", paths.get("platlib") or ""] + site.getsitepackages()
    pip = any(os.path.isdir(os.path.join(d, "pip")) for d in dirs)
    return {
        "executable": sys.executable,
        "version": "%d.%d.%d" % sys.version_info[:3],
        "platform": platform_key(),
        "pip": pip,
        "compiler": bool(cxx) and os.path.exists(os.path.join(inc, "Python.h")),
        "free_bytes": free,
    }


def verify_record(folder):
    """None when the installed tree is exactly the wheel's, else the first problem: every file
    the RECORD lists has its recorded hash, and no file is there that the RECORD does not list
    (a planted `.pth` or module would be imported), no symbolic link. Bytecode is dropped, not
    trusted: a `__pycache__` entry cannot be told from a planted one (its header only names the
    source), so the processes of this `up` compile kvpd again from the verified sources."""
    infos = [d for d in os.listdir(folder) if d.endswith(".dist-info")]
    if len(infos) != 1:
        return "no single .dist-info folder"
    with open(os.path.join(folder, infos[0], "RECORD")) as f:
        lines = f.read().splitlines()
    listed = set()
    for line in lines:
        path, _, rest = line.partition(",")
        full = os.path.normpath(os.path.join(folder, path))
        if not full.startswith(folder + os.sep):
            continue  # e.g. ../bin/kvpd of the console script: not part of the importable tree
        listed.add(full)
        algo_hash = rest.split(",")[0]
        if not algo_hash:
            continue
        algo, _, want = algo_hash.partition("=")
        try:
            with open(full, "rb") as f:
                got = hashlib.new(algo, f.read()).digest()
        except (OSError, ValueError) as e:
            return "%s: %s" % (path, getattr(e, "strerror", None) or e)
        if b64(got) != want:
            return "%s differs from its RECORD hash" % path
    return unexpected(folder, listed)


def unexpected(folder, listed):
    """The first entry of the tree that is not the wheel's (bytecode caches are removed)."""
    for root, dirs, files in os.walk(folder):
        if "__pycache__" in dirs:
            import shutil

            shutil.rmtree(os.path.join(root, "__pycache__"))
            dirs.remove("__pycache__")
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                return "%s is a symbolic link, which the wheel does not have" % rel
            if name in files and path not in listed and rel != MARKER:
                return "%s is not in the wheel's RECORD" % rel
    return None


def candidates(base, source, platform):
    """Installed bundles of `source` usable by this Python: native for its platform first."""
    out = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for name in names:
        # Only the folders `install` made, named by their wheel's digest: not a slot's link
        # (RUN_DIR/bundle/engine would read as a bundle through the link, and pointing the
        # slot at itself leaves a link loop), not an install still in its temporary folder.
        if os.path.islink(os.path.join(base, name)):
            continue
        try:
            with open(os.path.join(base, name, MARKER)) as f:
                m = json.load(f)
        except (OSError, ValueError):
            continue
        if str(m.get("digest", ""))[:16] != name:
            continue
        if m.get("source") == source and m.get("platform") in (platform, ANY):
            out.append((m.get("platform") != platform, name, m))
    return [(n, m) for _, n, m in sorted(out)]


def point_slot(base, slot, name):
    if name == slot or os.sep in name:
        raise ValueError("bundle folder %r cannot be the target of slot %r" % (name, slot))
    link = os.path.join(base, slot)
    if os.path.islink(link) and os.readlink(link) == name:
        return
    tmp = "%s.tmp-%d" % (link, os.getpid())
    os.symlink(name, tmp)
    os.replace(tmp, link)


def native_info(folder):
    """What `kvpd native info` would say, by loading the extension itself: kvpd.native would
    import NumPy first (0.1 s), which the proxy's Python need not have."""
    import importlib.util
    import platform

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = os.path.join(folder, "kvpd", "native", "_sparse_lru" + suffix)
    info = {"implementation": "numpy", "machine": platform.machine(), "reason": None}
    if not os.path.exists(path):
        info["reason"] = "the bundle has no native core for this platform"
        return info
    try:
        spec = importlib.util.spec_from_file_location("kvpd.native._sparse_lru", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        info.update(mod.build_info())
    except Exception as e:  # noqa: BLE001 - any load failure: the fallback, and why
        info["reason"] = "extension not loadable (%r)" % (e,)
        return info
    info.update(implementation="native", module=path)
    # vLLM-Ascend's planner interface: its row-planner path (avx512..., neon, baseline).
    planner = os.path.join(folder, "kvpd", "native", "_ascend_planner" + suffix)
    info["ascend_planner"] = None
    if os.path.exists(planner):
        try:
            spec = importlib.util.spec_from_file_location("kvpd.native._ascend_planner", planner)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            info["ascend_planner"] = mod.isa_info()["isa"]
        except Exception as e:  # noqa: BLE001 - any load failure: vLLM-Ascend's planner, and why
            info["ascend_planner_reason"] = "extension not loadable (%r)" % (e,)
    return info


def check(run_dir, slot, source, prefer=None, full=False):
    out = {"slot": slot, "ready": False}
    out.update(facts(run_dir))
    base = os.path.join(os.path.abspath(run_dir), "bundle")
    found = candidates(base, source, out["platform"])
    found.sort(key=lambda nm: nm[1].get("digest") != prefer)  # stable: keeps native first
    if not found:
        out["problem"] = "no bundle of this kvpd for %s" % out["platform"]
        return out
    problems = []
    for name, marker in found:  # noqa: B007 (marker is used after the loop)
        # the first that verifies wins
        folder = os.path.join(base, name)
        bad = verify_record(folder)
        if bad:
            problems.append("bundle %s is damaged: %s" % (name, bad))
            continue
        break
    else:
        out["problem"] = "; ".join(problems)
        return out
    sys.path.insert(0, folder)
    try:
        import importlib

        import kvpd

        # After an install, everything the slot's processes import first; on a re-`up` the
        # RECORD check above already proved every file unchanged, so kvpd itself suffices.
        for module in SLOT_IMPORTS.get(slot, ()) if full else ():
            importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means: not usable
        out["problem"] = "importing kvpd from %s failed: %r" % (folder, e)
        return out
    if not os.path.abspath(kvpd.__file__).startswith(folder + os.sep):
        out["problem"] = "kvpd was imported from %s, not from the bundle" % kvpd.__file__
        return out
    info = native_info(folder)
    point_slot(base, slot, name)
    # What the slot's processes will put on PYTHONPATH must be this very folder.
    if os.path.realpath(os.path.join(base, slot)) != os.path.realpath(folder):
        out["problem"] = "the slot link %s does not lead to %s" % (os.path.join(base, slot), folder)
        return out
    out.update(
        ready=True,
        digest=marker["digest"],
        folder=folder,
        bundle_platform=marker["platform"],
        native=info,
    )
    return out


def drop(wheel):
    os.remove(wheel)
    for d in (os.path.dirname(wheel), os.path.dirname(os.path.dirname(wheel))):
        try:
            os.rmdir(d)  # .incoming/SLOT and .incoming, when empty
        except OSError:
            pass


def collect_garbage(base, source):
    """Remove bundles of other kvpd sources that no slot points at (a kvpd upgrade leaves the
    old one behind; a slot still pointing at one keeps it until that slot is installed)."""
    import shutil

    names = os.listdir(base)
    linked = {
        os.readlink(os.path.join(base, n)) for n in names if os.path.islink(os.path.join(base, n))
    }
    for name in names:
        path = os.path.join(base, name)
        if name in linked or os.path.islink(path):
            continue
        try:
            with open(os.path.join(path, MARKER)) as f:
                old = json.load(f).get("source") != source
        except (OSError, ValueError):
            continue  # not a bundle (or one being installed): not ours to remove
        if old:
            shutil.rmtree(path, ignore_errors=True)


def install(run_dir, slot, source, wheel, digest, platform):
    base = os.path.join(os.path.abspath(run_dir), "bundle")
    with open(wheel, "rb") as f:
        got = hashlib.sha256(f.read()).hexdigest()
    if got != digest:
        return {"slot": slot, "ready": False, "problem": "upload damaged: sha256 %s" % got}
    import shutil
    import subprocess

    dest = os.path.join(base, digest[:16])
    try:
        with open(os.path.join(dest, MARKER)) as f:
            done = json.load(f).get("digest") == digest and verify_record(dest) is None
    except (OSError, ValueError):
        done = False
    if done:  # another slot of this host, same Python platform, installed it a moment ago
        drop(wheel)
        return check(run_dir, slot, source, prefer=digest, full=True)
    tmp = "%s.tmp-%d" % (dest, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    # pip isolated from the user's environment and site (-I, --isolated), nothing
    # fetched (--no-index, --no-deps), no bytecode written (verify_record would drop it).
    argv = [sys.executable, "-I", "-m", "pip", "install", "--isolated", "--no-deps"]
    argv += ["--no-index", "--no-compile", "--quiet", "--disable-pip-version-check"]
    argv += ["--no-warn-script-location", "--target", tmp, wheel]
    # No configuration file either (--isolated still reads the global one and PIP_CONFIG_FILE;
    # os.devnull there makes pip skip them all).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        err = r.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return {"slot": slot, "ready": False, "problem": "pip failed: %s" % " | ".join(err)}
    marker = {"digest": digest, "source": source, "platform": platform, "wheel": wheel}
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump(marker, f)
    shutil.rmtree(dest, ignore_errors=True)  # a damaged copy of the same digest
    os.rename(tmp, dest)
    drop(wheel)
    out = check(run_dir, slot, source, prefer=digest, full=True)
    out["installed"] = True
    if out["ready"]:
        collect_garbage(base, source)
    return out


def main(argv):
    if sys.version_info < (3, 10):
        slot = argv[2] if len(argv) > 2 else ""
        v = "%d.%d" % sys.version_info[:2]
        print(
            json.dumps(
                {
                    "slot": slot,
                    "ready": False,
                    "version": v,
                    "too_old": True,
                    "executable": sys.executable,
                    "problem": "Python %s is older than 3.10" % v,
                }
            )
        )
        return 0
    if argv[:1] == ["check"] and len(argv) == 4:
        res = check(*argv[1:])
    elif argv[:1] == ["facts"] and len(argv) == 4:  # read-only: what preflight checks
        res = {"slot": argv[2]}
        res.update(facts(argv[1]))
    elif argv[:1] == ["install"] and len(argv) == 7:
        res = install(*argv[1:])
    else:
        print(
            "usage: check RUN_DIR SLOT SOURCE | install RUN_DIR SLOT SOURCE WHEEL DIGEST PLATFORM",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
