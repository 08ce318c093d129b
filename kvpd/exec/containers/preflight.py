"""Preflight for containers on the nodes: the runtime answers, the container exists
and runs, every node runs the same image, and the run dir is the same folder inside and
outside (a token written on the host over SFTP is read inside). What else preflight checks
(packages and their versions, npu-smi, /dev/shm, ports) already runs inside the container,
because the host's transport is the container's."""

from __future__ import annotations

import posixpath
import secrets
from collections.abc import Callable

from kvpd.exec.containers.life import host_side, inspect
from kvpd.exec.containers.transport import ContainerTransport
from kvpd.exec.fanout import Fanout
from kvpd.exec.preflight.checks import Check
from kvpd.exec.transport import Transport
from kvpd.plan.value import HostSpec, Plan


def _one(h: HostSpec, t: Transport, token: str) -> tuple[list[Check], str]:
    """(checks of host `h`, the image its container runs or "")."""
    spec = h.container
    assert spec is not None
    kind = f"{spec.runtime} (namespace stand-in)" if spec.standin else spec.runtime
    name = f"container {spec.name}"
    try:
        got = inspect(host_side(t), spec, h.name)
    except Exception as e:  # noqa: BLE001 - runtime missing, socket permission: the message
        return [Check(h.name, name, False, str(e), "see the message")], ""
    if got is None:
        fix = (
            "`kvpd up` starts it"
            if spec.started_by_kvpd
            else f"start it (`kvpd plan` shows the {spec.runtime} run line) or fix its name"
        )
        return [Check(h.name, name, False, f"no such container ({kind})", fix)], ""
    if got.status != "running":
        fix = f"{spec.command} start {spec.name}"
        return [Check(h.name, name, False, f"{got.status}, not running ({kind})", fix)], ""
    checks = [Check(h.name, name, True, f"running ({kind}), image {got.image[:24]}")]
    # The run dir: written on the host (as `up` writes every file), read inside.
    inside = t if isinstance(t, ContainerTransport) else ContainerTransport(t, spec)
    run_dir = inside.resolve(h.run_dir)
    path = posixpath.join(run_dir, f".kvpd-container-{token}")
    try:
        host_side(t).run(["mkdir", "-p", "--", run_dir], timeout_s=30)
        host_side(t).put(path, token.encode())
        r = inside.run(["cat", "--", path], timeout_s=60)
        ok = r.ok and r.stdout == token
        detail = (
            "a file written on the host is read inside"
            if ok
            else (f"not visible inside ({r.stderr.strip()[:200] or 'other content'})")
        )
    except Exception as e:  # noqa: BLE001
        ok, detail = False, f"could not compare: {e}"
    finally:
        try:
            host_side(t).run(["rm", "-f", "--", path], timeout_s=30)
        except Exception:  # noqa: BLE001 - a left token is a tiny hidden file
            pass
    fix = (
        ""
        if ok
        else f"mount {run_dir} into the container at the same path (-v {run_dir}:{run_dir})"
    )
    checks.append(Check(h.name, "run dir inside", ok, detail, fix))
    return checks, got.image


def preflight_checks(plan: Plan, transports: Callable[[str], Transport]) -> list[Check]:
    hosts = [h for h in plan.hosts if h.container is not None]
    if not hosts:
        return []
    token = secrets.token_hex(8)
    checks: list[Check] = []
    images: dict[str, str] = {}
    with Fanout(min(16, len(hosts))) as fan:
        outcomes = fan.each(
            lambda h: _one(h, transports(h.name), token), hosts, key=lambda h: h.name
        )
    for h in hosts:
        o = outcomes[h.name]
        if o.value is None:
            checks.append(Check(h.name, "container", False, str(o.error), "see the message"))
            continue
        checks += o.value[0]
        if o.value[1]:
            images[h.name] = o.value[1]
    if len(set(images.values())) > 1:
        detail = ", ".join(f"{h}={i[:24]}" for h, i in sorted(images.items()))
        checks.append(
            Check(
                "*", "same image everywhere", False, detail, "run one image (digest) on every node"
            )
        )
    return checks
