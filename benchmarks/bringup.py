"""Bring-up time over SSH on an 8-host test bed: parallel `up` vs one host at a time, and kvpd's
own overhead (total `up` time minus the health-gated service time on the critical path).

Run as root (it creates its own bed with scripts/testbed.sh under a separate PFX/NET/dir, so it
never collides with a test session's bed, and powers it off at the end):

    .venv/bin/python benchmarks/bringup.py [--hosts 8] [--delay 1.0] [--stages 2] [--repeat 3]

Every host runs one lightweight service per stage: a tiny HTTP server that answers /health only
`--delay` seconds after it started. The plan is built directly (no profile), so only the
executor and the SSH transport are measured. Targets: parallel >= 3x faster than
serial; overhead <= 2 s for 8 hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvpd.exec.executor import Executor
from kvpd.exec.pool import TransportPool
from kvpd.exec.state import StateStore
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, Plan, ProcessSpec
from kvpd.testing.termination import stop_on_termination

REPO = Path(__file__).resolve().parents[1]
TESTBED_SH = REPO / "scripts" / "testbed.sh"
BED_ENV = {
    "PFX": "kvpdb",
    "NET": "10.214.0",
    "KVPD_TESTBED_DIR": str(REPO / ".kvpd" / "bench-bed"),
}
BASE_PORT = 18100
# The lightweight service (the bed dir is shared by every host, so all run this one file).
SERVICE = """#!{python}
# kvpd bring-up benchmark service: /health answers 200 once DELAY seconds have passed.
import http.server, os, sys, time
host, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
# Age from the process's own start (it is the launch script's bash, exec'ed into python), so
# interpreter start-up counts as the service's time, not kvpd's.
ticks = int(open("/proc/self/stat").read().rpartition(")")[2].split()[19])
born = ticks / os.sysconf("SC_CLK_TCK")


def age():
    return float(open("/proc/uptime").read().split()[0]) - born


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if age() >= delay else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer((host, port), Health).serve_forever()
"""


def bed(command: str, n: int = 0) -> str:
    env = {**os.environ, **BED_ENV, "PYTHON": sys.executable}
    argv = ["bash", str(TESTBED_SH), command] + ([str(n)] if n else [])
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        sys.exit(f"testbed.sh {command} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def build_plan(
    addresses: dict[str, str], bed_dir: Path, service: Path, stages: int, delay: float
) -> Plan:
    hosts = tuple(
        HostSpec(
            name=h,
            address=a,
            transport="ssh",
            user="root",
            key=str(bed_dir / "id_ed25519"),
            known_hosts=str(bed_dir / "known_hosts"),
            run_dir=".kvpd/bringup-bench/run",
        )
        for h, a in addresses.items()
    )
    files, procs = [], []
    for stage in range(stages):
        for h in hosts:
            name, port = f"svc{stage}-{h.name}", BASE_PORT + stage
            cmd = (str(service), h.address, str(port), f"{delay:g}")
            script = f"{name}/launch.sh"
            files.append(FileSpec(h.name, script, "exec " + " ".join(cmd) + "\n", 0o755))
            procs.append(
                ProcessSpec(
                    name=name,
                    host=h.name,
                    role="service",
                    stage=stage,
                    script=script,
                    command=cmd,
                    ports=(port,),
                    # kvpd's default polling interval (the planner's), 60 s is never reached
                    health=HealthCheck(f"http://{h.address}:{port}/health", timeout_s=60),
                )
            )
    return Plan("bringup-bench", "bench", hosts, tuple(files), tuple(procs))


def timed_up(plan: Plan, store: StateStore, *, serial: bool) -> float:
    """Seconds of one `up` (fresh connections, like a new `kvpd up`), then a `down`."""
    pool = TransportPool(plan.hosts)
    ex = Executor(pool, store=store, serial=serial, grace_s=5)
    try:
        t0 = time.perf_counter()
        state = ex.up(plan)
        elapsed = time.perf_counter() - t0
        result = ex.down(state)
        if result.stop.leftover:
            sys.exit(f"down left processes running: {result.stop.leftover}")
    finally:
        ex.close()
    return elapsed


def main() -> None:
    stop_on_termination()  # SIGTERM/SIGHUP run the cleanup below, as Ctrl-C does
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--delay", type=float, default=1.0, help="seconds until a service is healthy")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the bench bed up afterwards")
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bringup.py needs root (it creates a network-namespace test bed)")

    bed_dir = Path(BED_ENV["KVPD_TESTBED_DIR"])
    t0 = time.perf_counter()
    bed("up", args.hosts)
    print(f"bed: {args.hosts} hosts up in {time.perf_counter() - t0:.2f}s ({bed_dir})")
    try:
        addresses = dict(
            ln.split()[:2] for ln in (bed_dir / "hosts").read_text().splitlines() if ln.strip()
        )
        service = bed_dir / "bringup-service.py"
        service.write_text(SERVICE.format(python=sys.executable))
        service.chmod(0o755)
        plan = build_plan(addresses, bed_dir, service, args.stages, args.delay)
        critical = args.stages * args.delay  # each stage waits for its slowest service
        with tempfile.TemporaryDirectory(prefix="kvpd-bringup-") as tmp:
            store = StateStore(tmp)
            timed_up(plan, store, serial=False)  # warm-up: page cache, sshd, host run dirs
            par = [timed_up(plan, store, serial=False) for _ in range(args.repeat)]
            ser = [timed_up(plan, store, serial=True) for _ in range(args.repeat)]
    finally:
        if not args.keep:
            bed("down")
    p, s = statistics.median(par), statistics.median(ser)
    figures = {
        "hosts": args.hosts,
        "stages": args.stages,
        "processes": len(plan.processes),
        "delay_s": args.delay,
        "critical_path_s": critical,
        "parallel_s": [round(x, 3) for x in par],
        "serial_s": [round(x, 3) for x in ser],
        "parallel_median_s": round(p, 3),
        "serial_median_s": round(s, 3),
        "speedup": round(s / p, 2),
        "overhead_s": round(p - critical, 3),
        "overhead_max_s": round(max(par) - critical, 3),
    }
    print(
        f"{args.hosts} hosts x {args.stages} stages ({len(plan.processes)} services, each "
        f"healthy {args.delay:g}s after start; critical path {critical:g}s), {args.repeat} runs:"
    )
    print(f"  parallel up: median {p:.2f}s  runs {', '.join(f'{x:.2f}' for x in par)}")
    print(f"  serial up:   median {s:.2f}s  runs {', '.join(f'{x:.2f}' for x in ser)}")
    ok_speed = s / p >= 3
    ok_over = p - critical <= 2
    print(f"  speedup:     {s / p:.1f}x (target >= 3x: {'met' if ok_speed else 'MISSED'})")
    print(
        f"  overhead:    {p - critical:.2f}s median, {max(par) - critical:.2f}s worst "
        f"(parallel minus critical path; target <= 2s: {'met' if ok_over else 'MISSED'})"
    )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
