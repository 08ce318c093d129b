"""Only SSH reaches the cluster: what going through a bastion and SSH channels costs, measured on
the same hosts reached both ways in one run.

Run as root (it makes its own bastion bed, `TOPOLOGY=bastion DIRECT=1`, under names and
addresses of its own, and powers it off at the end):

    .venv/bin/python benchmarks/bastion.py [--hosts 8] [--repeat 3] [--probes 200] [--seconds 5]

Figures:
- `up` + `down` of benchmarks/bringup.py's plan (2 stages x N hosts, each service healthy 1 s
  after start): kvpd's overhead (up minus the critical path; down whole) through the bastion
  (`ssh.jump`) against the same hosts reached directly, runs interleaved.
- One health probe: a direct socket from this machine, a channel of a direct SSH connection,
  a channel of the connection through the bastion, and the same without the one session kvpd
  runs on every new connection (so sshd sets TCP_NODELAY; p50/p90 of `--probes` each,
  interleaved).
- Connecting to every host at once (a new TransportPool, all hosts in parallel, as `up` does):
  direct against through the bastion, whose one connection all the hosts' connections share.
- The canary's exchanges from this machine (the /metrics scrape before, one completion, the
  scrape after) against a stand-in engine on a host: a direct socket, a channel of a direct SSH
  connection, a channel through the bastion (p50/p90 of `--probes / 4` each, interleaved).
- `kvpd forward`'s relay: p50 latency per request and requests/s at 16 concurrent streams
  through it (each request a new connection, so a new channel) against the same service
  reached directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kvpd.bench import canary, metrics
from kvpd.exec.executor import Executor
from kvpd.exec.forward import forwarder
from kvpd.exec.http_wire import direct
from kvpd.exec.local import LocalTransport
from kvpd.exec.pool import TransportPool
from kvpd.exec.ssh import SSHTransport
from kvpd.exec.ssh import connect as ssh_connect
from kvpd.exec.state import StateStore
from kvpd.exec.transport import HttpRequest, Transport
from kvpd.plan.value import HostSpec, Plan

REPO = Path(__file__).resolve().parents[1]
TESTBED_SH = REPO / "scripts" / "testbed.sh"
BED_DIR = REPO / ".kvpd" / "bench-bastion"
BED_ENV = {"TOPOLOGY": "bastion", "DIRECT": "1", "PFX": "kvpdk", "NET": "10.217.0",
           "EDGE": "10.217.1", "NONROOT": "", "NOFORWARD": "",
           "KVPD_TESTBED_DIR": str(BED_DIR)}  # fmt: skip
_spec = importlib.util.spec_from_file_location("bringup", Path(__file__).with_name("bringup.py"))
assert _spec is not None
assert _spec.loader is not None
bringup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bringup)


def bed(command: str, n: int = 0) -> None:
    env = {**os.environ, **BED_ENV, "PYTHON": sys.executable}
    argv = ["bash", str(TESTBED_SH), command] + ([str(n)] if n else [])
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        sys.exit(f"testbed.sh {command} failed:\n{r.stdout}\n{r.stderr}")


def up_down(plan: Plan, store: StateStore) -> tuple[float, float]:
    """Seconds of one `up` and one `down`, on fresh connections (like new `kvpd` commands)."""
    ex = Executor(TransportPool(plan.hosts), store=store, grace_s=5)
    try:
        t0 = time.perf_counter()
        state = ex.up(plan)
        t1 = time.perf_counter()
        result = ex.down(state)
        t2 = time.perf_counter()
        if result.stop.leftover:
            sys.exit(f"down left processes running: {result.stop.leftover}")
    finally:
        ex.close()
    return t1 - t0, t2 - t1


def connect_all(hosts: tuple[HostSpec, ...]) -> float:
    """Seconds to open a connection to every host in parallel (a fresh pool, as `kvpd up`)."""
    pool = TransportPool(hosts)
    threads = [threading.Thread(target=lambda h=h: pool[h.name].home()) for h in hosts]
    try:
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0
    finally:
        pool.close()


def without_first_session(spec: HostSpec, req: HttpRequest) -> SSHTransport:
    """A transport through the bastion as kvpd connected before it ran one session first on
    every connection: sshd keeps Nagle's algorithm on a connection without a session. Its own
    bastion connection (another chain key: accepting unknown keys, all known anyway)."""
    saved = ssh_connect.first_session
    ssh_connect.first_session = lambda *_, **__: None  # type: ignore[assignment]
    try:
        t = SSHTransport(spec, accept_unknown_host_key=True)
        t.http(req)
        return t
    finally:
        ssh_connect.first_session = saved


def canary_exchanges(t: Transport, url: str) -> None:
    """What the canary sends to one engine from this machine: /metrics, a completion, /metrics."""
    metrics.fetch(t, url + "/metrics")
    assert canary.send(t, url, "standin", canary.prompt(), max_tokens=4) > 0
    metrics.fetch(t, url + "/metrics")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def ms(xs: list[float]) -> str:
    return f"p50 {pct(xs, 0.5) * 1e3:.2f} ms, p90 {pct(xs, 0.9) * 1e3:.2f} ms"


def load(address: str, port: int, seconds: float, streams: int = 16) -> tuple[float, list[float]]:
    """Requests/s and per-request latencies of `streams` clients doing GET /health."""
    lat: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        mine = []
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            c = http.client.HTTPConnection(address, port, timeout=30)
            c.request("GET", "/health")
            c.getresponse().read()
            c.close()
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(lat) / (time.perf_counter() - t0), lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true", help="leave the bench bed up afterwards")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bastion.py needs root (it creates a network-namespace test bed)")
    bed("up", args.hosts)
    try:
        run(args)
    finally:
        if not args.keep:
            bed("down")


def run(args: argparse.Namespace) -> None:
    rows = [ln.split() for ln in (BED_DIR / "hosts").read_text().splitlines() if ln.strip()]
    jump_address, jump_user = (BED_DIR / "jump").read_text().split()
    jump = f"{jump_user}@{jump_address}"
    service = BED_DIR / "bringup-service.py"
    service.write_text(bringup.SERVICE.format(python=sys.executable))
    service.chmod(0o755)
    plain = bringup.build_plan({r[0]: r[1] for r in rows}, BED_DIR, service, 2, 1.0)
    jumped = dataclasses.replace(
        plain, hosts=tuple(dataclasses.replace(h, jump=jump) for h in plain.hosts)
    )
    bringup_figures(args, plain, jumped)
    exchange_figures(args, plain, rows[0][0], rows[0][1], jump, service)


def bringup_figures(args: argparse.Namespace, plain: Plan, jumped: Plan) -> None:
    """`up` + `down` both ways, interleaved, then connecting to every host both ways."""
    critical = 2.0
    times: dict[str, list[tuple[float, float]]] = {"direct": [], "bastion": []}
    connects: dict[str, list[float]] = {"direct": [], "bastion": []}
    with tempfile.TemporaryDirectory(prefix="kvpd-bastion-") as tmp:
        store = StateStore(tmp)
        up_down(plain, store)  # warm-up: page cache, sshd, host run dirs
        for _ in range(args.repeat):
            times["direct"].append(up_down(plain, store))
            times["bastion"].append(up_down(jumped, store))
        for _ in range(args.repeat):
            connects["direct"].append(connect_all(plain.hosts))
            connects["bastion"].append(connect_all(jumped.hosts))
    over = {k: statistics.median(u for u, _ in v) - critical for k, v in times.items()}
    down = {k: statistics.median(d for _, d in v) for k, v in times.items()}
    print(f"up + down, {args.hosts} hosts x 2 stages, critical path {critical:g}s, "
          f"{args.repeat} runs each, interleaved:")  # fmt: skip
    for k in times:
        ups = ", ".join(f"{u:.2f}" for u, _ in times[k])
        print(f"  {k:8s} up runs {ups}s: overhead {over[k]:.2f}s; down {down[k]:.2f}s")
    print(f"  overhead through the bastion / direct: up {over['bastion'] / over['direct']:.2f}x, "
          f"down {down['bastion'] / down['direct']:.2f}x")  # fmt: skip
    print(f"connecting to all {args.hosts} hosts in parallel (the home dir read), median of "
          f"{args.repeat}: direct {statistics.median(connects['direct']):.2f}s, through the "
          f"bastion {statistics.median(connects['bastion']):.2f}s")  # fmt: skip


def exchange_figures(
    args: argparse.Namespace, plain: Plan, h1: str, address: str, jump: str, service: Path
) -> None:
    """Health probe, canary and forward figures against services on host `h1`."""
    spec = plain.host(h1)
    t_direct, t_jump = SSHTransport(spec), SSHTransport(dataclasses.replace(spec, jump=jump))
    port = bringup.BASE_PORT + 50
    s = t_direct.start_detached([str(service), address, str(port), "0"], log="svc.log", cwd=".")
    try:
        req = HttpRequest("GET", address, port, "/health", timeout_s=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if direct(req, h1).status == 200:
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.1)
        t_jump.http(req)  # connect all before timing
        t_direct.http(req)
        t_nagle = without_first_session(dataclasses.replace(spec, jump=jump), req)
        lat: dict[str, list[float]] = {"socket": [], "channel": [], "bastion": [], "nagle": []}
        calls = {
            "socket": lambda: direct(req, h1),
            "channel": lambda: t_direct.http(req),
            "bastion": lambda: t_jump.http(req),
            "nagle": lambda: t_nagle.http(req),
        }
        for _ in range(args.probes):
            for k, call in calls.items():
                t0 = time.perf_counter()
                assert call().status == 200
                lat[k].append(time.perf_counter() - t0)
        print(f"health probe, {args.probes} each, interleaved:")
        print(f"  direct socket:                 {ms(lat['socket'])}")
        print(f"  channel, direct SSH:           {ms(lat['channel'])}")
        print(f"  channel, SSH through bastion:  {ms(lat['bastion'])}")
        print(f"  the same, no first session:    {ms(lat['nagle'])} (sshd's Nagle left on)")
        t_nagle.close()

        canary_figures(args, spec, t_direct, t_jump, address)

        fwd = forwarder(t_jump, address, port, 0)
        threading.Thread(target=fwd.serve_forever, daemon=True).start()
        try:
            figures = {
                streams: (load(address, port, args.seconds, streams),
                          load("127.0.0.1", fwd.port, args.seconds, streams))
                for streams in (1, 16)
            }  # fmt: skip
        finally:
            fwd.close()
        print(f"kvpd forward (through the bastion), {args.seconds:g}s per figure:")
        for streams, ((rps_d, lat_d), (rps_f, lat_f)) in figures.items():
            added = (pct(lat_f, 0.5) - pct(lat_d, 0.5)) * 1e3
            print(f"  {streams:2d} streams: direct {rps_d:.0f} req/s ({ms(lat_d)}); forward "
                  f"{rps_f:.0f} req/s ({ms(lat_f)}); added p50 {added:.2f} ms")  # fmt: skip
    finally:
        t_direct.signal_group(s.pgid, 9, start_ticks=s.start_ticks)
        t_direct.close()
        t_jump.close()


def canary_figures(
    args: argparse.Namespace, spec: HostSpec, t_direct: SSHTransport, t_jump: SSHTransport,
    address: str,
) -> None:  # fmt: skip
    """The canary's exchanges with a stand-in engine on the host, three ways, interleaved."""
    port = bringup.BASE_PORT + 51
    argv = [sys.executable, "-m", "kvpd.testing.standin_engine", "--host", address,
            "--port", str(port), "--role", "mixed"]  # fmt: skip
    s = t_direct.start_detached(argv, log="standin.log", cwd=".", env={"PYTHONPATH": str(REPO)})
    url = f"http://{address}:{port}"
    ways: dict[str, Transport] = {
        "socket": LocalTransport(spec), "channel": t_direct, "bastion": t_jump,
    }  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                metrics.fetch(ways["socket"], url + "/metrics")
                break
            except Exception:  # not listening yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        lat: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(max(1, args.probes // 4)):
            for k, t in ways.items():
                t0 = time.perf_counter()
                canary_exchanges(t, url)
                lat[k].append(time.perf_counter() - t0)
        n = len(lat["socket"])
        print(f"canary exchanges (/metrics, completion, /metrics), stand-in engine, {n} each:")
        print(f"  direct socket:                 {ms(lat['socket'])}")
        print(f"  channel, direct SSH:           {ms(lat['channel'])}")
        print(f"  channel, SSH through bastion:  {ms(lat['bastion'])}")
    finally:
        t_direct.signal_group(s.pgid, 15, start_ticks=s.start_ticks)


if __name__ == "__main__":
    main()
