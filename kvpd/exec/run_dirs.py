"""Run dirs: `up` creates each host's run dir private (0700) with a marker file naming the
deployment; `down --purge` removes only kvpd's own entries of a dir carrying that marker.

A run dir path comes from the profile and, at `down`, from the state file: neither proves the
dir is kvpd's. The marker does: kvpd writes it only into a dir it created itself (or found
empty and owned by the login user), so purge never empties a folder kvpd did not make, and
inside one it removes only the names kvpd writes there (rendered files, scripts, logs, the node
bundle, supervisor status), leaving anything else and the dir itself in place.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from kvpd.exec.transport import Transport
from kvpd.plan.bundle import BUNDLE_DIR
from kvpd.plan.lognames import LOG_DIR
from kvpd.plan.supervision import STATUS_DIR
from kvpd.plan.value import Plan

MARKER = ".kvpd-run-dir"
PATH_VARS = ("_DIR", "_PATH", "_ROOT", "_HOME", "TMPDIR", "_FOLDER")
FIXED_ENTRIES = (BUNDLE_DIR, LOG_DIR, STATUS_DIR, "bench")  # bench: `kvpd bench` results

# $1 run dir, $2 marker name, $3 marker text. A dir that exists is marked only when it is
# empty and owned by the login user; an existing marked dir is made private again.
MARK_SH = r"""d=$1 m=$2 tag=$3
if [ -e "$d" ] || [ -L "$d" ]; then
  if [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && [ -z "$(ls -A -- "$d")" ]; then
    (umask 077 && printf '%s\n' "$tag" >"$d/$m") || exit 3
  fi
  [ -f "$d/$m" ] && [ ! -L "$d/$m" ] && chmod 700 -- "$d"
  exit 0
fi
mkdir -p -- "$(dirname -- "$d")" && mkdir -m 700 -- "$d" &&
  (umask 077 && printf '%s\n' "$tag" >"$d/$m")
"""

# $1 run dir, $2 marker name, $3 marker text, then kvpd's entry names (no '/').
# Exit 0: removed (or there was nothing); 4: not kvpd's (no or another marker); 5: entries
# kvpd did not write are left, listed on stdout.
PURGE_SH = r"""d=$1 m=$2 tag=$3; shift 3
[ -e "$d" ] || [ -L "$d" ] || exit 0
[ -d "$d" ] && [ ! -L "$d" ] && [ -f "$d/$m" ] && [ ! -L "$d/$m" ] || exit 4
[ "$(cat -- "$d/$m")" = "$tag" ] || exit 4
cd -- "$d" || exit 4
for n in "$@"; do rm -rf -- "./$n"; done
rm -f -- ./.*.tmp ./.kvpd-container-* "./$m"
cd / && rmdir -- "$d" 2>/dev/null && exit 0
ls -A -- "$d"; exit 5
"""


def marker_text(deployment: str) -> str:
    return f"kvpd run dir of deployment {deployment}"


def mark(t: Transport, run_dir: str, deployment: str) -> None:
    """Create `run_dir` 0700 with its marker (see MARK_SH); OSError when that fails."""
    r = t.run(["sh", "-c", MARK_SH, "kvpd-run-dir", run_dir, MARKER, marker_text(deployment)])
    if not r.ok:
        raise OSError(f"creating the run dir {run_dir} failed: {r.stderr.strip()[-300:]}")


def _top(path: str) -> str | None:
    """The first component of a relative path inside the run dir; None for anything else."""
    norm = posixpath.normpath(path)
    if posixpath.isabs(norm) or norm in (".", "") or norm.startswith(".."):
        return None
    return norm.split("/", 1)[0]


def entries(plan: Plan, host: str, run_dir: str) -> list[str]:
    """The top-level names kvpd writes into `host`'s run dir."""
    paths: Iterable[str] = [f.path for f in plan.files if f.host == host]
    procs = [p for p in plan.processes if p.host == host]
    paths = [*paths, *plan.fresh_dirs, *plan.made_dirs, *(p.script for p in procs)]
    paths += [p.log for p in procs if p.log]
    # Folders the plan points its processes at through env variables named for a path
    # (VLLM_CACHE_ROOT, VLLM_RPC_BASE_PATH, TMPDIR, ...): relative ones are in the run dir,
    # their cwd, and absolute ones may be too.
    for p in procs:
        for k, v in p.env:
            if k.endswith(PATH_VARS) and v and not v.startswith("$"):
                paths.append(v[len(run_dir) + 1 :] if v.startswith(run_dir + "/") else v)
    names = {n for n in map(_top, paths) if n} | set(FIXED_ENTRIES)
    return sorted(n for n in names if n not in (".", "..", MARKER))


def purge(t: Transport, run_dir: str, plan: Plan, host: str) -> str:
    """Remove kvpd's entries of `host`'s marked run dir; '' when done, else what was kept."""
    args = [run_dir, MARKER, marker_text(plan.deployment), *entries(plan, host, run_dir)]
    r = t.run(["sh", "-c", PURGE_SH, "kvpd-purge", *args], timeout_s=300)
    if r.exit_code == 4:
        return (
            f"kept {run_dir}: it has no kvpd marker of deployment {plan.deployment!r} "
            f"({MARKER}), so kvpd did not create it. Fix: remove it by hand if it is yours"
        )
    if r.exit_code == 5:
        left = ", ".join(r.stdout.split()[:10])
        return f"kept {run_dir}: it holds entries kvpd did not write ({left}); removed kvpd's own"
    return "" if r.ok else f"{run_dir}: {r.stderr.strip()[-200:]}"
