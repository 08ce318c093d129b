"""The node bundle step of `kvpd up` on an 8-host SSH test bed: first install, and re-`up` with
the bundle in place (target: <= 0.2 s per host, hosts in parallel).

Run as root (it brings up scripts/testbed.sh with PFX/NET/KVPD_TESTBED_DIR from the environment,
defaults below, and powers it off at the end unless --keep):

    .venv/bin/python benchmarks/bundle.py [--hosts 8] [--repeat 5] [--python @/path/to/vllm]
                                          [--other-python /path/to/python3.X]

Each host gets one engine slot whose interpreter is the engine's (`@<repo>/.venv-engine/bin/vllm`
by default: the bed shares the repo). Timed, as `up` runs it (connections already open, since
`up` resolved the run dirs over them first):
  - the controller's wheel build with an empty cache (once per kvpd source);
  - first install: empty run dirs; check, upload, pip install, verify on every host in parallel;
  - re-up: the same step with the bundle in place (one check per host).
With --other-python, the last host's slot uses that interpreter (another Python version), so its
first install includes building the wheel on that host.
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
from typing import Any

from kvpd.exec.bundle import wheel as wheels
from kvpd.exec.bundle.installer import BundleInstaller
from kvpd.exec.bundle.result import SlotResult
from kvpd.exec.pool import TransportPool
from kvpd.plan.bundle import BundleUse
from kvpd.plan.value import HostSpec, Plan
from kvpd.testing.termination import stop_on_termination

REPO = Path(__file__).resolve().parents[1]
TESTBED_SH = REPO / "scripts" / "testbed.sh"
BED_ENV = {
    "PFX": os.environ.get("PFX", "kvpdn"),
    "NET": os.environ.get("NET", "10.215.0"),
    "KVPD_TESTBED_DIR": os.environ.get("KVPD_TESTBED_DIR", str(REPO / ".kvpd" / "bundle-bed")),
}
RUN_DIR = ".kvpd/bundle-bench/run"


def bed(command: str, n: int = 0, extra_python: str | None = None) -> None:
    env = {**os.environ, **BED_ENV, "PYTHON": sys.executable}
    if extra_python:  # the bed shares that Python's installation with its hosts
        env["EXTRA_PYTHONS"] = extra_python
    argv = ["bash", str(TESTBED_SH), command] + ([str(n)] if n else [])
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        sys.exit(f"testbed.sh {command} failed:\n{r.stdout}\n{r.stderr}")


def build_plan(
    addresses: dict[str, str], bed_dir: Path, python: str, other: str | None = None
) -> Plan:
    hosts = tuple(
        HostSpec(
            name=h,
            address=a,
            user="root",
            key=str(bed_dir / "id_ed25519"),
            known_hosts=str(bed_dir / "known_hosts"),
            run_dir=RUN_DIR,
        )
        for h, a in addresses.items()
    )
    pythons = [python] * len(hosts)
    if other:
        pythons[-1] = other
    uses = tuple(
        BundleUse(h.name, "engine", py, (f"engine-{h.name}",), ("benchmark",))
        for h, py in zip(hosts, pythons, strict=True)
    )
    return Plan("bundle-bench", "bench", hosts, (), (), bundle=uses)


def timed(plan: Plan, pool: TransportPool, run_dirs: dict[str, str]) -> tuple[float, list]:
    t0 = time.perf_counter()
    results = BundleInstaller(lambda h: pool[h]).install(plan, run_dirs)
    return time.perf_counter() - t0, results


def ssh_floor(plan: Plan, pool: TransportPool) -> float:
    """One `true` per host, in parallel over the open connections: what any per-host step
    costs at least on this bed (the SSH channel, and 8 "hosts" sharing this machine's cores)."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(plan.hosts)) as ex:
        list(ex.map(lambda h: pool[h.name].run(["true"], timeout_s=30), plan.hosts))
    return time.perf_counter() - t0


def _print_figures(
    figures: dict[str, Any],
    args: argparse.Namespace,
    w: wheels.Wheel,
    first: list[SlotResult],
    re_walls: list[float],
    floor: list[float],
    times: tuple[float, float, float],
) -> None:
    """What main measured, as text (its `figures` as JSON with --json)."""
    build_s, connect_s, first_s = times
    per_host_first = [r.seconds for r in first]
    print(f"node bundle on {args.hosts} bed hosts ({w.name}, {figures['wheel_kib']} KiB):")
    print(f"  wheel build on the controller (empty cache): {build_s:.2f}s")
    print(f"  connect + resolve run dirs (before the step): {connect_s:.2f}s")
    med_first = statistics.median(per_host_first)
    print(
        f"  first up:  {first_s:.2f}s wall; per host median {med_first:.2f}s, max "
        f"{max(per_host_first):.2f}s (check, upload, pip install, verify)"
    )
    for r in first:
        if r.source.startswith("host:"):
            print(
                f"  {r.host}: another platform ({r.report.get('platform')}): wheel built on the "
                f"host and installed in {r.seconds:.2f}s"
            )
    print(
        f"  re-up:     wall median {statistics.median(re_walls):.3f}s over {args.repeat} runs; "
        f"per host median {figures['reup_per_host_median_s']:.3f}s, max "
        f"{figures['reup_per_host_max_s']:.3f}s (target <= 0.2s: "
        f"{'met' if figures['reup_per_host_max_s'] <= 0.2 else 'MISSED'})"
    )
    print(
        f"  SSH floor: `true` on every host in parallel: median {statistics.median(floor):.3f}s "
        f"({os.cpu_count()} CPUs shared by all {args.hosts} bed hosts and the controller)"
    )
    if args.json:
        print(json.dumps(figures))


def main() -> None:
    stop_on_termination()  # SIGTERM/SIGHUP run the cleanup below, as Ctrl-C does
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--python", default=f"@{REPO / '.venv-engine' / 'bin' / 'vllm'}")
    ap.add_argument("--other-python", help="interpreter of another version for the last host")
    ap.add_argument("--keep", action="store_true", help="leave the bed up afterwards")
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bundle.py needs root (it creates a network-namespace test bed)")
    bed_dir = Path(BED_ENV["KVPD_TESTBED_DIR"])
    bed("up", args.hosts, args.other_python)
    try:
        addresses = dict(
            ln.split()[:2] for ln in (bed_dir / "hosts").read_text().splitlines() if ln.strip()
        )
        plan = build_plan(addresses, bed_dir, args.python, args.other_python)
        with tempfile.TemporaryDirectory(prefix="kvpd-bundle-bench-") as cache:
            os.environ["KVPD_CACHE_DIR"] = cache
            t0 = time.perf_counter()
            w = wheels.build_local()
            build_s = time.perf_counter() - t0
            wheel_kib = round(w.path.stat().st_size / 1024)
            pool = TransportPool(plan.hosts)
            try:
                t0 = time.perf_counter()
                run_dirs = {h.name: pool[h.name].resolve(h.run_dir) for h in plan.hosts}
                connect_s = time.perf_counter() - t0
                for h in plan.hosts:
                    pool[h.name].run(["rm", "-rf", "--", run_dirs[h.name]], timeout_s=60)
                    pool[h.name].run(["mkdir", "-p", "--", run_dirs[h.name]], timeout_s=60)
                first_s, first = timed(plan, pool, run_dirs)
                again = [timed(plan, pool, run_dirs) for _ in range(args.repeat)]
                floor = [ssh_floor(plan, pool) for _ in range(args.repeat)]
                for h in plan.hosts:
                    pool[h.name].run(["rm", "-rf", "--", run_dirs[h.name]], timeout_s=60)
            finally:
                pool.close()
    finally:
        if not args.keep:
            bed("down")
    assert all(r.action == "installed" for r in first), [r.to_dict() for r in first]
    assert all(r.action == "kept" for _, rs in again for r in rs)
    per_host_first = [r.seconds for r in first]
    re_walls = [s for s, _ in again]
    per_host_re = [r.seconds for _, rs in again for r in rs]
    figures = {
        "hosts": args.hosts,
        "wheel": w.name,
        "wheel_kib": wheel_kib,
        "native": w.native,
        "local_build_s": round(build_s, 2),
        "connect_s": round(connect_s, 3),
        "first_wall_s": round(first_s, 3),
        "first_per_host_s": [round(x, 3) for x in per_host_first],
        "first_sources": [r.source for r in first],
        "reup_wall_s": [round(x, 3) for x in re_walls],
        "reup_per_host_median_s": round(statistics.median(per_host_re), 3),
        "reup_per_host_max_s": round(max(per_host_re), 3),
        "ssh_floor_s": [round(x, 3) for x in floor],
        "cpus": os.cpu_count(),
    }
    _print_figures(figures, args, w, first, re_walls, floor, (build_s, connect_s, first_s))


if __name__ == "__main__":
    main()
