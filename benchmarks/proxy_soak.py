"""Proxy soak: 2,000 concurrent streaming requests held for 60 s, then 10,000 idle keep-alive
client connections, through `kvpd proxy` in front of stand-in backends (kvpd.testing.backend:
2 prefillers + 2 decoders, each decode a stream of SSE events). Reports errors, the latency
added over the two-hop floor (the client calling a prefiller, then a decoder, itself) at the
same concurrency, and the proxy's RSS and open files at start, peak and end.

Client, proxy and backends run as separate processes, so each has its own open-files budget.
With `--example-proxy PATH` (vLLM-Ascend's load_balance_proxy_server_example.py, fetched by
you; never commit it) the same soak runs against it too, for the record.

    .venv/bin/python benchmarks/proxy_soak.py [--streams 2000] [--hold 60] [--idle 10000]
        [--example-proxy load_balance_proxy_server_example.py --example-python PY]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import free_port, parse_head, proc_cpu_seconds, request_bytes  # noqa: E402

from kvpd.testing.termination import stop_on_termination  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


class Stream(asyncio.Protocol):
    """Keep-alive client connection, one request at a time; a response ends at its
    Content-Length or the chunked terminator. Records the first body byte's time and whether
    the stream ended with [DONE]."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bool]] | None = None
        self.head = b""
        self.tail = b""
        self.need = -1  # -1 no head yet, -2 chunked, else body bytes left
        self.status = 0
        self.first_at = 0.0
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        if self.need == -1:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status, self.need = parse_head(self.head[:end])
            data = self.head[end + 4 :]
            self.head = b""
            self.tail = b""
        if data and not self.first_at:
            self.first_at = time.perf_counter()
        if self.need == -2:
            self.tail = (self.tail + data)[-40:]
            if self.tail.endswith(b"\r\n0\r\n\r\n"):
                self._done(b"[DONE]" in self.tail)
        else:
            self.need -= len(data)
            if self.need <= 0:
                self._done(True)

    def _done(self, clean: bool) -> None:
        self.need = -1
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result((self.status, clean))

    async def call(self, request: bytes, timeout: float) -> tuple[int, bool]:
        if self.lost:
            raise ConnectionError("connection closed by the server")
        self.first_at = 0.0
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)  # type: ignore[union-attr]
        return await asyncio.wait_for(self.waiter, timeout)


async def connect(port: int) -> Stream:
    _, conn = await asyncio.get_running_loop().create_connection(Stream, "127.0.0.1", port)
    return conn


@dataclass
class Phase:
    name: str
    total: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def pct(self, which: str, q: float) -> float:
        xs = sorted(getattr(self, which))
        return xs[min(len(xs) - 1, int(len(xs) * q))] * 1e3 if xs else float("nan")


class Sampler:
    """RSS (MiB) and open files of one process, sampled every second."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float, int]] = []

    def sample(self) -> tuple[float, int]:
        rss = 0.0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
        fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        self.samples.append((time.monotonic(), rss, fds))
        return rss, fds

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(1.0)

    @property
    def peak(self) -> tuple[float, int]:
        return max(s[1] for s in self.samples), max(s[2] for s in self.samples)


async def open_many(port: int, n: int, batch: int = 250) -> list[Stream]:
    conns: list[Stream] = []
    for i in range(0, n, batch):
        conns += await asyncio.gather(*(connect(port) for _ in range(min(batch, n - i))))
    return conns


async def stream_phase(
    name: str, ports: dict[str, list[int]], proxy: int | None, streams: int, hold: float,
    stream_s: float, sampler: Sampler | None,
) -> Phase:  # fmt: skip
    """`streams` closed-loop workers for `hold` seconds: through the proxy, or (proxy None)
    prefill then decode directly (the floor)."""
    phase = Phase(name)
    conns, req = await _open_streams(ports, proxy, streams)
    clock = time.perf_counter
    start = clock()
    window = _Window(
        measure_from=start + stream_s * 1.5,  # after the staggered start
        end=start + hold,
        timeout=max(60.0, stream_s * 10),
        stream_s=stream_s,
    )
    task = asyncio.ensure_future(sampler.run()) if sampler else None
    await asyncio.gather(*(_worker(c, phase, proxy, req, window) for c in conns))
    if task:
        task.cancel()
    for c in conns:
        for one in c[:2] if isinstance(c, tuple) else (c,):
            one.transport.close()
    return phase


async def _open_streams(
    ports: dict[str, list[int]], proxy: int | None, streams: int
) -> tuple[list, bytes]:
    """The proxy's connections and its request, or (proxy None) the floor's pairs to both
    prefill/decode pairs, each with the requests it sends."""
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 16, "stream": True}
    p_body = dict(body, max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
    d_body = dict(body, kv_transfer_params={"do_remote_prefill": True, "remote_block_ids": [[1]]})
    if proxy is not None:
        return await open_many(proxy, streams), request_bytes(proxy, "/v1/completions", body)
    conns: list = []
    for i, n in enumerate((streams // 2, streams - streams // 2)):
        pp, dp = ports["prefill"][i], ports["decode"][i]
        p_req = request_bytes(pp, "/v1/completions", p_body, "0" * 32)
        d_req = request_bytes(dp, "/v1/completions", d_body, "0" * 32)
        pairs = zip(await open_many(pp, n), await open_many(dp, n), strict=True)
        conns += [(p, d, p_req, d_req) for p, d in pairs]
    return conns, b""


@dataclass(frozen=True)
class _Window:
    """One phase's clock: measured from `measure_from` to `end`, each call bounded by
    `timeout`, the starts spread over one stream (`stream_s`)."""

    measure_from: float
    end: float
    timeout: float
    stream_s: float


async def _worker(c: object, phase: Phase, proxy: int | None, req: bytes, w: _Window) -> None:
    """Requests back to back until the window ends; the latencies of those wholly inside it."""
    clock = time.perf_counter
    measure_from, end, timeout = w.measure_from, w.end, w.timeout
    await asyncio.sleep(random.random() * w.stream_s)  # spread the starts over one stream
    while clock() < end:
        t0 = clock()
        try:
            if proxy is not None:
                status, clean = await c.call(req, timeout)  # type: ignore[attr-defined]
                first = c.first_at  # type: ignore[attr-defined]
            else:
                p, d, p_req, d_req = c  # type: ignore[misc]
                status, clean = await p.call(p_req, timeout)
                if status == 200:
                    status, clean = await d.call(d_req, timeout)
                first = d.first_at
        except (ConnectionError, asyncio.TimeoutError) as e:
            phase.error(type(e).__name__)
            return
        done = clock()
        if status != 200 or not clean:
            phase.error(f"HTTP {status}" if status != 200 else "stream without [DONE]")
            continue
        phase.ok += 1
        if t0 >= measure_from and done <= end:
            phase.total.append(done - t0)
            phase.first.append(first - t0)


async def idle_phase(
    port: int, n: int, idle_s: float, sampler: Sampler, path: str
) -> dict[str, float]:
    """n keep-alive connections, each served once, idle for idle_s, then served again."""
    conns = await open_many(port, n)
    health = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode()
    out = {"errors": 0.0}

    async def one(c: Stream) -> None:
        try:
            status, _ = await c.call(health, 60)
            if status != 200:
                out["errors"] += 1
        except (ConnectionError, asyncio.TimeoutError):
            out["errors"] += 1

    for i in range(0, n, 500):
        await asyncio.gather(*(one(c) for c in conns[i : i + 500]))
    rss, fds = sampler.sample()
    await asyncio.sleep(idle_s)
    out["rss_held"], out["fds_held"] = sampler.sample()
    out["lost_while_idle"] = float(sum(c.lost for c in conns))
    for i in range(0, n, 500):
        await asyncio.gather(*(one(c) for c in conns[i : i + 500] if not c.lost))
    for c in conns:
        c.transport.close()  # type: ignore[union-attr]
    return out


def start_backends(gap_ms: float, chunks: int) -> tuple[dict[str, list[int]], list]:
    ports: dict[str, list[int]] = {"prefill": [], "decode": []}
    procs = []
    for _ in range(2):  # one process per P+D pair: 2 prefillers and 2 decoders in all
        p, d = free_port(), free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvpd.testing.backend", "--prefill-port", str(p),
             "--decode-port", str(d), "--delay-ms", "5", "--chunks", str(chunks),
             "--chunk-gap-ms", str(gap_ms)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        proc.stdout.readline()  # type: ignore[union-attr]
        procs.append(proc)
        ports["prefill"].append(p)
        ports["decode"].append(d)
    return ports, procs


def start_proxy(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                time.sleep(1.0)  # listening; give the health checks a round
                return proc
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{cmd} did not listen on {port} within 60 s")


def stop(procs: list) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def soak(name: str, cmd: list[str], port: int, ports: dict, args: argparse.Namespace,
         stream_s: float, floor: Phase, health: str) -> dict:  # fmt: skip
    log = Path(tempfile.mkstemp(suffix=".log", prefix="soak-proxy-")[1])
    proc = start_proxy(cmd, port, log)
    try:
        sampler = Sampler(proc.pid)
        rss0, fds0 = sampler.sample()
        cpu0 = proc_cpu_seconds(proc.pid)
        phase = asyncio.run(stream_phase(name, ports, port, args.streams, args.hold, stream_s,
                                         sampler))  # fmt: skip
        cpu = proc_cpu_seconds(proc.pid) - cpu0
        counters = proxy_counters(port)
        idle = asyncio.run(idle_phase(port, args.idle, args.idle_hold, sampler, health))
        time.sleep(2.0)
        rss1, fds1 = sampler.sample()
        peak_rss, peak_fds = sampler.peak
        t0 = sampler.samples[0][0]
        # RSS every 10 s of the streaming phase: bounded means flat after the ramp-up
        timeline = [rss for t, rss, _ in sampler.samples if t - t0 <= args.hold + 2][::10]
    finally:
        stop([proc])
    lines = log.read_text().splitlines()
    notes = [ln for ln in lines if "open-files" in ln]
    warnings = [ln for ln in lines if " WARNING " in ln and "open-files" not in ln]
    notes += [f"{len(warnings)} warnings, e.g. {w.split(': ', 1)[-1]}" for w in warnings[:1]]
    log.unlink()
    return {"name": name, "phase": phase, "floor": floor, "rss": (rss0, peak_rss, rss1),
            "fds": (fds0, peak_fds, fds1), "idle": idle, "cpu": cpu, "notes": notes,
            "timeline": timeline, "counters": counters}  # fmt: skip


def proxy_counters(port: int) -> str:
    """Retries and failures from kvpd's /metrics (other proxies have none)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return ""
    keep = ("kvpd_proxy_retries_total ", "kvpd_proxy_failures_total", "transitions_total")
    rows = [ln for ln in text.splitlines() if ln.startswith(keep) and not ln.endswith(" 0")]
    return "; ".join(r.replace("kvpd_proxy_", "") for r in rows) or "no retries, no failures"


def report(r: dict, args: argparse.Namespace) -> None:
    ph, fl = r["phase"], r["floor"]
    errors = sum(ph.errors.values())
    print(f"\n== {r['name']}: {args.streams} concurrent streams for {args.hold:g} s, then "
          f"{args.idle} idle keep-alive connections for {args.idle_hold:g} s")  # fmt: skip
    print(f"  completed streams {ph.ok}, errors {errors} {ph.errors or ''}; floor "
          f"{fl.ok} streams, errors {sum(fl.errors.values())} {fl.errors or ''}")  # fmt: skip
    for which, label in (("first", "first event"), ("total", "whole stream")):
        fp50, fp99 = fl.pct(which, 0.5), fl.pct(which, 0.99)
        pp50, pp99 = ph.pct(which, 0.5), ph.pct(which, 0.99)
        added = f"added p50 {pp50 - fp50:+7.1f} p99 {pp99 - fp99:+7.1f} ms"
        print(f"  {label:12} floor p50 {fp50:8.1f} p99 {fp99:8.1f} | proxy p50 {pp50:8.1f} "
              f"p99 {pp99:8.1f} | {added}")  # fmt: skip
    (r0, rp, r1), (f0, fp, f1) = r["rss"], r["fds"]
    timeline = " ".join(f"{x:.0f}" for x in r["timeline"])
    print(f"  proxy RSS MiB start {r0:.0f} peak {rp:.0f} end {r1:.0f}; open files start {f0} "
          f"peak {fp} end {f1}; RSS every 10 s while streaming: {timeline}")  # fmt: skip
    idle = r["idle"]
    print(
        f"  idle: {args.idle} connections held with RSS {idle['rss_held']:.0f} MiB, "
        f"{idle['fds_held']} open files; lost while idle {idle['lost_while_idle']:.0f}; "
        f"errors {idle['errors']:.0f}; proxy CPU {r['cpu']:.1f} s over the streaming phase"
    )
    if r["counters"]:
        print(f"  proxy /metrics after streaming: {r['counters']}")
    for note in r["notes"]:
        print(f"  proxy log: {note.split(': ', 1)[-1]}")


def main() -> None:
    stop_on_termination()  # SIGTERM/SIGHUP run the cleanup below, as Ctrl-C does
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--hold", type=float, default=60.0, help="seconds of streaming load")
    ap.add_argument("--floor-hold", type=float, default=20.0, help="seconds of the floor run")
    ap.add_argument("--idle", type=int, default=10000, help="idle keep-alive connections")
    ap.add_argument("--idle-hold", type=float, default=15.0)
    ap.add_argument("--chunks", type=int, default=20, help="SSE events per stream")
    ap.add_argument("--gap-ms", type=float, default=200.0, help="pause between events")
    ap.add_argument("--example-proxy", help="vLLM-Ascend's load_balance_proxy_server_example.py")
    ap.add_argument(
        "--example-python",
        default=sys.executable,
        help="python with fastapi, httpx and uvicorn for the example proxy",
    )
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    need = args.idle + 2 * args.streams + 100
    if hard < need:
        raise SystemExit(f"the client needs {need} open files; the hard limit is {hard}")
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        print("uvloop not installed: the load generator runs on plain asyncio", file=sys.stderr)
    random.seed(0)
    stream_s = args.chunks * args.gap_ms / 1e3
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    ports, backends = start_backends(args.gap_ms, args.chunks)
    results = []
    try:
        floor = asyncio.run(stream_phase("floor", ports, None, args.streams, args.floor_hold,
                                         stream_s, None))  # fmt: skip
        hp = ["--prefiller-hosts", "127.0.0.1", "127.0.0.1", "--prefiller-ports",
              *map(str, ports["prefill"]), "--decoder-hosts", "127.0.0.1", "127.0.0.1",
              "--decoder-ports", *map(str, ports["decode"])]  # fmt: skip
        port = free_port()
        most = max(args.idle, args.streams) + 1000
        kvpd = [sys.executable, "-m", "kvpd.proxy", "--port", str(port), *hp,
                "--max-connections", str(most), "--log-level", "INFO"]  # fmt: skip
        results.append(soak("kvpd proxy", kvpd, port, ports, args, stream_s, floor, "/health"))
        if not args.example_proxy:
            print("\nvLLM-Ascend example proxy: skipped (no --example-proxy PATH given; fetch "
                  "load_balance_proxy_server_example.py from vllm-ascend's "
                  "examples/disaggregated_prefill_v1/ and pass its path)")  # fmt: skip
        elif not Path(args.example_proxy).is_file():
            print(f"\nvLLM-Ascend example proxy: skipped ({args.example_proxy} does not exist)")
        elif subprocess.run([args.example_python, "-c", "import fastapi, httpx, uvicorn"],
                            capture_output=True).returncode:  # fmt: skip
            print(f"\nvLLM-Ascend example proxy: skipped ({args.example_python} lacks fastapi, "
                  "httpx or uvicorn; pass --example-python)")  # fmt: skip
        else:
            port = free_port()
            ex = [args.example_python, args.example_proxy, "--host", "127.0.0.1", "--port",
                  str(port), *hp]  # fmt: skip
            results.append(soak("vLLM-Ascend example proxy", ex, port, ports, args, stream_s,
                                floor, "/healthcheck"))  # fmt: skip
    finally:
        stop(backends)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    print(
        f"\nproxy soak on {os.cpu_count()} CPUs; loadavg before {' '.join(load0)}, after "
        f"{' '.join(load1)}; streams of {args.chunks} events {args.gap_ms:g} ms apart "
        f"({stream_s:g} s); floor measured for {args.floor_hold:g} s at the same concurrency"
    )
    for r in results:
        report(r, args)


if __name__ == "__main__":
    main()
