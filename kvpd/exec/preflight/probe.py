"""The probe preflight runs on each host with `python3 -c` (stdlib only, read-only except the
shared-directory token), printing one JSON document."""

import inspect

from kvpd.exec.procfs import listening_in


def clang_omp() -> "dict[str, bool]":
    """Whether clang runs and its resource dir holds `omp.h` (what vLLM-Ascend's JIT build of
    its sparse planner needs). Standard library only, annotations quoted: the probe and the
    planner gate (kvpd.exec.preflight.planner_gate) run this very source on hosts with any
    python3."""
    import os
    import subprocess

    try:
        r = subprocess.run(["clang", "--print-resource-dir"], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"clang": False, "omp_h": False}
    ok = r.returncode == 0
    omp_h = os.path.join(r.stdout.strip(), "include", "omp.h")
    return {"clang": ok, "omp_h": ok and os.path.exists(omp_h)}


# The /proc/net/tcp parser is the transports' own, sent as source (the probe is one script).
PROBE = (
    inspect.getsource(listening_in)
    + inspect.getsource(clang_omp)
    + r'''
import json, os, platform, shutil, subprocess, sys
req = json.loads(sys.argv[1])
out = {"arch": platform.machine(), "python3": sys.version.split()[0]}
VERSIONS = """
import json, sys, sysconfig, importlib.metadata as m
r = {"site": sysconfig.get_paths()["purelib"], "python": sys.version.split()[0], "v": {}}
for n in sys.argv[1:]:
    try:
        r["v"][n] = m.version(n)
    except Exception:
        r["v"][n] = None
print(json.dumps(r))
"""
pk = []  # one answer per requested interpreter, in order
for need in req.get("packages", []):
    exe = need.get("path")
    if not exe:  # the interpreter of a console script found on PATH
        found = shutil.which(need["next_to"])
        if not found:
            pk.append({"error": "not found"})
            continue
        exe = os.path.join(os.path.dirname(os.path.realpath(found)), "python")
    try:
        res = subprocess.run([exe, "-c", VERSIONS, *need["names"]], capture_output=True,
                             text=True, timeout=120)
        pk.append(json.loads(res.stdout) if res.returncode == 0 else {"error": res.stderr[-300:]})
    except FileNotFoundError:
        pk.append({"error": "not found"})
    except Exception as e:
        pk.append({"error": repr(e)})
out["packages"] = pk
out["commands"] = {c: bool(shutil.which(c)) or (os.sep in c and os.access(c, os.X_OK))
                   for c in req.get("commands", [])}
out["paths"] = {p: os.path.exists(os.path.expanduser(p)) for p in req.get("paths", [])}
mem = {}
try:
    for line in open("/proc/meminfo"):
        k, v = line.split(":", 1)
        mem[k] = int(v.split()[0]) * 1024
except OSError:
    pass
out["mem_available"] = mem.get("MemAvailable")
try:
    st = os.statvfs("/dev/shm")
    out["shm_free"] = st.f_bavail * st.f_frsize
except OSError:
    out["shm_free"] = None
if req.get("npu"):
    try:
        r = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60)
        out["npu"] = r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        out["npu"] = False
if req.get("clang_omp"):
    out.update(clang_omp())
tables = []
for name in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        tables.append(open(name).read())
    except OSError:
        pass
ports = listening_in(tables)
out["busy_ports"] = sorted(p for p in req.get("ports", []) if p in ports)
shared = {}
token = req.get("token", "")
for d in req.get("shared_dirs", []):
    d = os.path.expanduser(d)
    info = {"exists": os.path.isdir(d), "writable": os.access(d, os.W_OK)}
    if info["exists"]:
        info["dev"] = os.stat(d).st_dev
        mine = os.path.join(d, ".kvpd-probe-" + req.get("host", "") + "-" + token)
        if req.get("write") and info["writable"]:
            try:
                with open(mine, "w") as f:
                    f.write(token)
                info["wrote"] = True
            except OSError:
                info["wrote"] = False
        if req.get("cleanup"):
            try:
                os.remove(mine)
            except OSError:
                pass
        seen = []
        for n in req.get("peers", []):
            try:
                with open(os.path.join(d, ".kvpd-probe-" + n + "-" + token)) as f:
                    if f.read() == token:
                        seen.append(n)
            except OSError:
                pass
        info["sees"] = seen
    shared[d] = info
out["shared"] = shared
print(json.dumps(out))
'''
)
