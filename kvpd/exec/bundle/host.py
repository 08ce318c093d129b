"""What the bundle step runs on a host, and what it accepts back from one.

A host's answers (its `check` line, its build result, the wheel it built) are untrusted: a report is
vetted field by field before anything uses it (`vet`), a host's build is read from the path the
controller named, verified and packed again on the controller (kvpd.exec.bundle.wheel_trust) before
it is cached, and where each slot's wheel came from is said in one vocabulary (`origin`)."""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from kvpd.exec.bundle import wheel as wheels
from kvpd.exec.bundle.wheel_trust import (
    ANY,
    MAX_WHEEL_BYTES,
    Refused,
    platform_ok,
    shown,
    verify_host_wheel,
)
from kvpd.exec.transport import Transport
from kvpd.plan.bundle import BUNDLE_DIR

NODE_SCRIPT = (wheels.BUILDER.parent / "node.py").read_text()
# Resolves each slot's interpreter (a command, or "@CMD": the #! interpreter of console script
# CMD, including pip's `#!/bin/sh` + `'''exec' "python"` form for long paths) and runs the node
# script in it. Arguments: RUN_DIR SOURCE SCRIPT MODE (check | facts), then SLOT SPEC pairs.
# One JSON line per slot.
CHECK_SH = r"""
set -f
interp() {
  case $1 in
    @*) f=$(command -v -- "${1#@}") || return 1
        IFS= read -r l < "$f" || return 1
        case $l in
          '#!/bin/sh'*) l=$(sed -n 2p -- "$f"); l=${l#*\"}; printf '%s\n' "${l%%\"*}" ;;
          '#!'*) set -- ${l#??}
                 if [ "${1##*/}" = env ]; then shift; [ "$1" = -S ] && shift; command -v -- "$1"
                 else printf '%s\n' "$1"; fi ;;
          *) printf '%s/python\n' "$(dirname -- "$f")" ;;
        esac ;;
    *) command -v -- "$1" ;;
  esac
}
run_dir=$1 source=$2 script=$3 mode=${4:-check}
shift 4
while [ $# -ge 2 ]; do
  slot=$1 spec=$2
  shift 2
  if ! py=$(interp "$spec") || [ -z "$py" ]; then
    printf '{"slot": "%s", "ready": false, "problem": "interpreter not found"}\n' "$slot"
    continue
  fi
  PYTHONDONTWRITEBYTECODE=1 "$py" -I -S -B -c "$script" "$mode" "$run_dir" "$slot" "$source" ||
    printf '{"slot": "%s", "ready": false, "problem": "%s exited %s"}\n' "$slot" "$py" "$?"
done
"""
# Builds in DIR with PYTHON; the wheel ends up at DIR/built.whl, the one path the controller
# reads back (never a path the host names).
BUILD_SH = r"""
cd -- "$1" && rm -rf src out built.whl && mkdir src && tar -xzf src.tar.gz -C src &&
  "$2" -I -B src/wheel_build.py src out && set -- out/*.whl && [ "$#" -eq 1 ] &&
  mv -f -- "$1" built.whl
"""
BUILT = "built.whl"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_TEXT_FIELDS = ("executable", "version", "folder", "problem")


def json_lines(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict):
                out.append(d)
    return out


def plain(value: object, limit: int = 300) -> str:
    """A host's text as it may be shown or recorded: printable, bounded."""
    return shown(value, limit)[1:-1]


def _untrusted(rep: dict[str, Any], out: dict[str, Any]) -> list[str]:
    """What is wrong with the fields of `rep` the controller relies on; a platform key or
    digest that is not one is dropped from `out`."""
    bad = []
    p = rep.get("platform")
    if p is not None and not platform_ok(p):
        bad.append(f"reported the platform {shown(p)}, which is not a Python platform key")
        out.pop("platform")
    m = re.match(r"cpython-3([0-9]+)", str(out.get("platform", "")))
    v = str(rep.get("version", ""))
    if m and v and not v.startswith(f"3.{m[1]}."):  # the SOABI names the version it reports
        bad.append(f"reported Python {shown(v)} with the platform {shown(p)}")
    bp = rep.get("bundle_platform")
    if bp is not None and bp not in (ANY, out.get("platform")):
        bad.append(f"reported a bundle for {shown(bp)} on a {shown(p)} Python")
    if out["ready"] and "platform" not in out:
        bad.append("reported a ready bundle without its platform")
    d = rep.get("digest")
    if d is not None and not (isinstance(d, str) and _DIGEST.fullmatch(d)):
        bad.append(f"reported the digest {shown(d)}, which is not a sha256")
        out.pop("digest")
    return bad


def vet(rep: dict[str, Any], slot: str) -> dict[str, Any]:
    """A host's report on one slot, every field the controller uses checked: a platform key
    that is not one, a bundle platform that is neither the host's nor the pure wheel's, a
    digest that is not a sha256 make the slot not ready, saying so."""
    out = dict(rep)
    out["slot"] = slot
    out["ready"] = rep.get("ready") is True
    bad = _untrusted(rep, out)
    for k in _TEXT_FIELDS:
        if k in out and out[k] is not None:
            out[k] = plain(out[k])
    for k in ("pip", "compiler", "too_old"):
        out[k] = rep.get(k) is True
    if not isinstance(rep.get("native"), dict):
        out["native"] = {}
    if bad:
        out["ready"] = False
        out["problem"] = (
            "; ".join(bad) + ": kvpd does not trust this host's answer (check the host; a "
            "compromised or broken Python reports this)"
        )
    return out


def origin(how: str) -> str:
    """Where a slot's wheel came from, as `up`, `status` and preflight say it."""
    if how == "local":
        return "controller build"
    if how == "cross":
        return "controller cross-build"
    if how == ANY:
        return "none (NumPy fallback)"
    if how.startswith("cache:host:"):
        return f"cached host build on {how[len('cache:host:') :]}"
    if how.startswith("host:"):
        return f"host build on {how[len('host:') :]}"
    if how == "earlier":
        return "installed by an earlier up"
    return how or "-"


def _bounded(t: Transport, path: str) -> str:
    """`path`, once the host said it is a regular file of at most MAX_WHEEL_BYTES (a link to
    /dev/zero would have the controller read forever)."""
    r = t.run(["stat", "-c", "%s %F", "--", path], timeout_s=60)
    size, _, kind = r.stdout.strip().partition(" ")
    if not r.ok or kind != "regular file" or not size.isdigit() or int(size) > MAX_WHEEL_BYTES:
        raise Refused(f"the built wheel is not a regular file of at most {MAX_WHEEL_BYTES} bytes")
    return path


def build_on(
    t: Transport, host: str, run_dir: str, python: str, platform: str, source: str
) -> wheels.Wheel:
    """Build this kvpd's wheel on `host` for its `platform`, verify it on the controller and
    cache it as that host's build; raise (Refused for a wheel that is not this kvpd's)."""
    d = posixpath.join(run_dir, BUNDLE_DIR, f".build-{source[:16]}")
    t.put(posixpath.join(d, "src.tar.gz"), wheels.source_tarball())
    try:
        r = t.run(["bash", "-c", BUILD_SH, "kvpd-build", d, python], timeout_s=900)
        res = json_lines(r.stdout)
        if not r.ok or not res:
            raise RuntimeError(plain(r.stderr.strip()[-300:] or f"exit {r.exit_code}"))
        data = t.read(_bounded(t, posixpath.join(d, BUILT)))
        name = posixpath.basename(str(res[-1].get("wheel", "")))
        v = verify_host_wheel(data, name, platform, wheels.reference_members())
        why = plain(res[-1].get("why", ""))
        return wheels.store(platform, v.name, v.data, v.native, why, built_on=host)
    except Refused as e:
        raise Refused(
            f"the wheel {host} built was refused: {e}. {host} may be compromised or not run "
            "this kvpd's build; nothing of it was cached or installed"
        ) from e
    finally:
        t.run(["rm", "-rf", "--", d], timeout_s=60)
