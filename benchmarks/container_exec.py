"""What running through a container's exec costs per kvpd operation: the median and
minimum time of `run(["true"])`, `alive(pid)` and `ports_listening` on this machine directly
and inside the namespace stand-in of a container runtime (kvpd/testing/kvpd-standin-runtime:
nsenter, which is what `docker exec` does; Docker's own exec adds its daemon round trip).
Needs root (mount and PID namespaces).

    .venv/bin/python benchmarks/container_exec.py [--rounds 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import kvpd
from kvpd.exec.containers.transport import ContainerTransport
from kvpd.exec.local import LocalTransport
from kvpd.exec.transport import Transport
from kvpd.plan.container import ContainerSpec
from kvpd.testing.termination import stop_on_termination

STANDIN = str(Path(kvpd.__file__).parent / "testing" / "kvpd-standin-runtime")


def timed(fn: Callable[[], object], rounds: int) -> tuple[float, float]:
    fn()  # warm
    ms = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    return statistics.median(ms), min(ms)


def main() -> None:
    stop_on_termination()  # SIGTERM/SIGHUP run the cleanup below, as Ctrl-C does
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the stand-in creates mount and PID namespaces")
    with tempfile.TemporaryDirectory() as tmp:
        host = LocalTransport(base_dir=tmp)
        spec = ContainerSpec("standin", STANDIN, f"kvpd-bench-{uuid.uuid4().hex[:6]}", "standin")
        r = host.run(spec.run_argv())
        if not r.ok:
            raise SystemExit(f"starting the stand-in failed: {r.stderr}")
        try:
            inside = ContainerTransport(host, spec)
            pid = inside.start_detached(["sleep", "600"], log=f"{tmp}/s.log", cwd=tmp).pid
            mine = os.getpid()
            rows: list[tuple[str, Transport, int]] = [("host", host, mine), ("inside", inside, pid)]
            print(f"{'operation':<22}{'where':<8}{'median ms':>10}{'min ms':>9}")
            for op, call in (
                ("run(['true'])", lambda t, p: t.run(["true"])),
                ("alive(pid)", lambda t, p: t.alive(p)),
                ("ports_listening", lambda t, p: t.ports_listening([1, 2])),
            ):
                for where, t, p in rows:
                    med, low = timed(lambda t=t, p=p, c=call: c(t, p), args.rounds)
                    print(f"{op:<22}{where:<8}{med:>10.2f}{low:>9.2f}")
        finally:
            host.run(spec.rm_argv())


if __name__ == "__main__":
    main()
