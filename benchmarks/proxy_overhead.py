"""Proxy overhead: latency and throughput through `kvpd proxy` against the floor (the client
calling the prefill backend, then the decode backend itself), with stand-in backends
(kvpd.testing.backend; prefill: JSON with kv_transfer_params; decode: 20 ms wait, then 16 SSE
chunks), at 1, 16 and 128 concurrent streams. Reports medians over repetitions, the proxy's
CPU time per 1,000 requests and, with --profile, where the proxy's CPU goes.

    .venv/bin/python benchmarks/proxy_overhead.py [--reps 3] [--duration 2] [--profile]
        [--client-key]  # the proxy checks a client key and the load sends it
        [--baseline old=/tmp/kvpd-old]  # another tree's proxy, alternated with this one's
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from result_table import print_table  # this folder: sys.path[0] when run as a script

from kvpd.testing.clock import free_port
from kvpd.testing.termination import stop_on_termination

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROMPT = "The quick brown fox jumps over the lazy dog. " * 12  # ~540 characters, ~135 tokens


def proc_cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads, from /proc/<pid>/task/*/schedstat (nanoseconds on the
    CPU; utime + stime in /proc/<pid>/stat count 10 ms ticks, too coarse for a 2 s run of a
    process that uses ~0.1 s of it); the tick counts where schedstat is missing."""
    try:
        return (
            sum(
                int(t.joinpath("schedstat").read_text().split()[0])
                for t in Path(f"/proc/{pid}/task").iterdir()
            )
            / 1e9
        )
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


def system_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, to report how loaded it was."""
    vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


# --client-key: the proxy checks a client key, and the load sends it (the gated path)
CLIENT_KEY = "bench-client-key-0123456789abcdef"
KEYED = False


def request_bytes(port: int, path: str, body: dict, request_id: str = "", auth: str = "") -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    rid = f"X-Request-Id: {request_id}\r\n" if request_id else ""
    rid += f"Authorization: Bearer {auth}\r\n" if auth else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n{rid}\r\n"
    ).encode() + data


def parse_head(head: bytes) -> tuple[int, int]:
    """A response head's status and how its body ends: -2 = chunked, else its Content-Length
    (the lean clients here measure the proxy, not HTTP parsing)."""
    head = head.lower()
    if b"transfer-encoding: chunked" in head:
        return int(head[9:12]), -2
    i = head.find(b"content-length:")
    j = head.find(b"\r\n", i)
    return int(head[9:12]), int(head[i + 15 : j if j > 0 else len(head)])


class Conn(asyncio.Protocol):
    """Lean keep-alive client connection: one request at a time; the end of a response is
    its Content-Length or the chunked terminator (our backends never send trailers)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None
        self.buf = b""
        self.need = -1  # body bytes still expected (Content-Length), -2 = chunked, -1 = no head
        self.status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        if self.need == -1:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status, self.need = parse_head(self.buf[:end])
            data = self.buf[end + 4 :]
            self.buf = b""
            self.tail = b""
        if self.need == -2:
            self.tail = (self.tail + data)[-7:]
            if self.tail.endswith(b"\r\n0\r\n\r\n") or self.tail == b"0\r\n\r\n":
                self._done()
        else:
            self.need -= len(data)
            if self.need <= 0:
                self._done()

    def _done(self) -> None:
        self.need = -1
        w = self.waiter
        self.waiter = None
        if w is not None and not w.done():
            w.set_result(self.status)

    async def call(self, request: bytes) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)  # type: ignore[union-attr]
        return await self.waiter


async def connect(port: int) -> Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(Conn, "127.0.0.1", port)
    return conn


@dataclass
class RunResult:
    latencies: list[float] = field(default_factory=list)
    rps: float = 0.0
    errors: int = 0
    proxy_cpu: float = 0.0
    busy: float = 0.0  # machine CPU busy fraction during the run (0-1, all cores)

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) * 1e3 if self.latencies else float("nan")

    @property
    def p99(self) -> float:
        if not self.latencies:
            return float("nan")
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3

    @property
    def cpu_per_1k(self) -> float:
        n = len(self.latencies)
        return self.proxy_cpu / n * 1000 if n else float("nan")


async def run_load(
    mode: str,
    ports: dict[str, int],
    streams: int,
    duration: float,
    warmup: float,
    proxy_pid: int | None,
) -> RunResult:
    """`mode` "proxy": POST to the proxy; "floor": prefill then decode, directly."""
    conns, reqs = await _open(mode, ports, streams)
    result = RunResult()
    t0 = time.perf_counter()
    load = _Load(mode, reqs, result, measure_from=t0 + warmup, end=t0 + warmup + duration)
    cpu_marks: list[float] = []
    sys_marks: list[tuple[float, float]] = []
    await asyncio.gather(
        _mark_window(warmup, duration, proxy_pid, cpu_marks, sys_marks),
        *(load.worker(c) for c in conns),
    )
    result.rps = len(result.latencies) / duration
    if len(cpu_marks) == 2:
        result.proxy_cpu = cpu_marks[1] - cpu_marks[0]
    if len(sys_marks) == 2:
        (b0, t0_), (b1, t1_) = sys_marks
        result.busy = (b1 - b0) / max(1, t1_ - t0_)
    for c in conns:
        for one in c if isinstance(c, tuple) else (c,):
            one.transport.close()  # type: ignore[union-attr]
    return result


@dataclass
class _Requests:
    """The request bytes one run sends, prepared before the clock starts."""

    proxy: bytes = b""  # mode "proxy": to the proxy
    prefill: bytes = b""  # mode "floor": exactly what the proxy would send the prefiller
    decode: bytes = b""  # ... and then the decoder


async def _open(mode: str, ports: dict[str, int], streams: int) -> tuple[list[object], _Requests]:
    """One connection per stream (a pair to prefiller and decoder for the floor) and the
    requests they send."""
    body = {"model": "fake", "prompt": PROMPT, "max_tokens": 16, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if mode == "proxy":
        conns: list[object] = [await connect(ports["proxy"]) for _ in range(streams)]
        key = CLIENT_KEY if KEYED else ""
        return conns, _Requests(
            proxy=request_bytes(ports["proxy"], "/v1/completions", body, auth=key)
        )
    # Exactly what the proxy would send, prepared once: the floor pays no JSON work.
    p_body = dict(body, max_tokens=1, stream=False)
    p_body.pop("stream_options")
    p_body["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False,
                                    "remote_engine_id": None, "remote_block_ids": None,
                                    "remote_host": None, "remote_port": None}  # fmt: skip
    d_body = dict(body, kv_transfer_params={"do_remote_prefill": True, "remote_block_ids":
                  [[1, 2, 3]], "remote_engine_id": "fake", "remote_host": "127.0.0.1",
                  "remote_port": ports["prefill"]})  # fmt: skip
    rid = "0" * 32
    reqs = _Requests(
        prefill=request_bytes(ports["prefill"], "/v1/completions", p_body, rid),
        decode=request_bytes(ports["decode"], "/v1/completions", d_body, rid),
    )
    conns = [(await connect(ports["prefill"]), await connect(ports["decode"]))
             for _ in range(streams)]  # fmt: skip
    return conns, reqs


async def _mark_window(
    warmup: float,
    duration: float,
    proxy_pid: int | None,
    cpu_marks: list[float],
    sys_marks: list[tuple[float, float]],
) -> None:
    """The proxy's CPU time and the system's busy time at the measured window's edges."""
    await asyncio.sleep(warmup)
    if proxy_pid:
        cpu_marks.append(proc_cpu_seconds(proxy_pid))
    sys_marks.append(system_busy())
    await asyncio.sleep(duration)
    if proxy_pid:
        cpu_marks.append(proc_cpu_seconds(proxy_pid))
    sys_marks.append(system_busy())


@dataclass
class _Load:
    """One run's workers: each sends its requests back to back until `end`, recording the
    latencies of the requests that ran wholly inside the measured window."""

    mode: str
    reqs: _Requests
    result: RunResult
    measure_from: float
    end: float

    async def worker(self, c: object) -> None:
        result = self.result
        lat = result.latencies
        clock = time.perf_counter
        mode, measure_from, end = self.mode, self.measure_from, self.end
        req, p_req, d_req = self.reqs.proxy, self.reqs.prefill, self.reqs.decode
        while True:
            start = clock()
            if start >= end:
                return
            try:
                if mode == "proxy":
                    status = await c.call(req)  # type: ignore[attr-defined]
                else:
                    p, d = c  # type: ignore[misc]
                    status = await p.call(p_req)
                    if status == 200:
                        status = await d.call(d_req)
            except ConnectionError:
                result.errors += 1
                return
            done = clock()
            if status != 200:
                result.errors += 1
            elif start >= measure_from and done <= end:
                lat.append(done - start)


def wait_http(url: str, deadline_s: float = 15.0) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise SystemExit(f"{url} did not become ready within {deadline_s} s")
        time.sleep(0.05)


def start_proxy(
    root: Path, ports: dict[str, int], port: int, profile_path: str | None
) -> subprocess.Popen:
    """`kvpd proxy` from the tree at `root` (this one, or a baseline's copy: its own code
    through cwd and PYTHONPATH) in front of the stand-in backends."""
    prof = ["-m", "cProfile", "-o", profile_path] if profile_path else []
    env = {**os.environ, **({"KVPD_PROXY_CLIENT_KEY": CLIENT_KEY} if KEYED else {})}
    if root != ROOT:
        env["PYTHONPATH"] = str(root)
    return subprocess.Popen(
        [sys.executable, *prof, "-m", "kvpd.proxy", "--port", str(port),
         "--prefiller-ports", str(ports["prefill"]), "--decoder-ports", str(ports["decode"]),
         "--log-level", "WARNING"],
        cwd=root, env=env,
    )  # fmt: skip


def start_processes(
    profile_path: str | None,
    chunk_gap_ms: float,
    procs: list[subprocess.Popen],
    baselines: list[tuple[str, Path]],
) -> tuple[dict[str, int], list[Target]]:
    """Start the stand-in backends, this tree's proxy and one per baseline tree, each
    appended to `procs` as soon as it runs: the caller's cleanup stops them even when this is
    interrupted half way."""
    ports = {"prefill": free_port(), "decode": free_port()}
    backends = subprocess.Popen(
        [sys.executable, "-m", "kvpd.testing.backend", "--prefill-port", str(ports["prefill"]),
         "--decode-port", str(ports["decode"]), "--delay-ms", "20", "--chunks", "16",
         "--chunk-gap-ms", str(chunk_gap_ms)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    procs.append(backends)
    backends.stdout.readline()  # type: ignore[union-attr]  # printed once both listen
    targets = []
    for name, root in [("proxy", ROOT), *baselines]:
        port = free_port()
        proc = start_proxy(root, ports, port, profile_path if root == ROOT else None)
        procs.append(proc)
        targets.append(Target(name, port, proc.pid))
    for t in targets:
        wait_http(f"http://127.0.0.1:{t.port}/health")
    return ports, targets


@dataclass
class Target:
    """A proxy under measurement: this tree's ("proxy") or a baseline tree's."""

    name: str
    port: int
    pid: int


def stop_processes(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        p.terminate()
    for p in reversed(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def fmt(v: float, spec: str = ".2f") -> str:
    return "-" if v != v else format(v, spec)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 128])
    ap.add_argument("--reps", type=int, default=3, help="repetitions; medians are reported")
    ap.add_argument("--duration", type=float, default=2.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument(
        "--client-key", action="store_true", help="the proxy checks a client key; requests send it"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="run the proxy under cProfile (slower) and print its top functions",
    )
    ap.add_argument(
        "--chunk-gap-ms",
        type=float,
        default=0.0,
        help="pause between the decoder's SSE chunks (0 = the 16 chunks back to back)",
    )
    ap.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also measure the proxy of another source tree (e.g. `git archive <commit>` "
        "unpacked in DIR), alternated with this one's in every repetition; repeatable",
    )
    ap.add_argument(
        "--together",
        action="store_true",
        help="with --baseline: load every proxy at the same time in each round (each with "
        "--streams streams) instead of one after the other",
    )
    ap.add_argument("--json", help="also write the results to this file")
    return ap.parse_args()


def measure(
    ports: dict[str, int], targets: list[Target], streams: int, args: argparse.Namespace
) -> dict[str, list[RunResult]]:
    """`args.reps` rounds of the floor and every target, in an order that rotates each round,
    so drift in machine load hits all of them alike."""
    runs: dict[str, list[RunResult]] = {"floor": [], **{t.name: [] for t in targets}}
    order: list[Target | None] = [None, *targets]
    if args.together:
        for _ in range(args.reps):
            runs["floor"].append(
                asyncio.run(run_load("floor", ports, streams, args.duration, args.warmup, None))
            )
            for t, r in zip(targets, asyncio.run(together(ports, targets, streams, args)),
                            strict=True):  # fmt: skip
                runs[t.name].append(r)
        return runs
    for rep in range(args.reps):
        k = rep % len(order)
        for t in order[k:] + order[:k]:
            tp = dict(ports, proxy=t.port) if t else ports
            mode = "proxy" if t else "floor"
            r = asyncio.run(
                run_load(mode, tp, streams, args.duration, args.warmup, t.pid if t else None)
            )
            runs[t.name if t else "floor"].append(r)
    return runs


async def together(
    ports: dict[str, int], targets: list[Target], streams: int, args: argparse.Namespace
) -> list[RunResult]:
    """Every target under its own `streams` streams at the same time: the proxies share the
    machine's state second by second, so their CPU per request compares without the drift
    between runs (the backends then serve streams x targets)."""
    return list(
        await asyncio.gather(
            *(
                run_load(
                    "proxy", dict(ports, proxy=t.port), streams, args.duration, args.warmup, t.pid
                )
                for t in targets
            )  # fmt: skip
        )
    )


def med(runs: list[RunResult], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in runs)


def row_of(name: str, streams: int, floor: list[RunResult], proxy: list[RunResult]) -> dict:
    pairs = list(zip(proxy, floor, strict=True))
    return {
        "proxy": name,
        "streams": streams,
        "floor_p50_ms": med(floor, "p50"),
        "floor_p99_ms": med(floor, "p99"),
        "proxy_p50_ms": med(proxy, "p50"),
        "proxy_p99_ms": med(proxy, "p99"),
        "added_p50_ms": med(proxy, "p50") - med(floor, "p50"),
        "floor_rps": med(floor, "rps"),
        "proxy_rps": med(proxy, "rps"),
        "ratio": med(proxy, "rps") / max(1e-9, med(floor, "rps")),
        "cpu_per_1k": med(proxy, "cpu_per_1k"),
        "errors": sum(r.errors for r in floor + proxy),
        "machine_busy": med(floor + proxy, "busy"),
        "all_proxy_rps": [round(r.rps) for r in proxy],
        "all_added_p50_ms": [round(p.p50 - f.p50, 3) for p, f in pairs],
        "all_cpu_per_1k": [round(r.cpu_per_1k, 4) for r in proxy],
    }


def paired(rows: list[dict], base: str) -> list[dict]:
    """This tree's proxy against a baseline's, per stream count: the median over rounds of
    the per-round ratios (the two ran next to each other in each round)."""
    out = []
    for r in rows:
        if r["proxy"] != "proxy":
            continue
        b = next(x for x in rows if x["proxy"] == base and x["streams"] == r["streams"])
        cpu = [n / o for n, o in zip(r["all_cpu_per_1k"], b["all_cpu_per_1k"], strict=True)]
        rps = [n / o for n, o in zip(r["all_proxy_rps"], b["all_proxy_rps"], strict=True)]
        added = [n - o for n, o in zip(r["all_added_p50_ms"], b["all_added_p50_ms"], strict=True)]
        out.append({"baseline": base, "streams": r["streams"],
                    "cpu_ratio": statistics.median(cpu), "cpu_ratio_range": (min(cpu), max(cpu)),
                    "rps_ratio": statistics.median(rps), "rps_ratio_range": (min(rps), max(rps)),
                    "added_p50_diff_ms": statistics.median(added)})  # fmt: skip
    return out


def _row(r: dict) -> str:
    return (f"{r['proxy'][:8]:>8} {r['streams']:>7} {fmt(r['floor_p50_ms']):>9} "
            f"{fmt(r['proxy_p50_ms']):>9} {fmt(r['added_p50_ms'], '+.2f'):>9} "
            f"{fmt(r['floor_p99_ms']):>9} {fmt(r['proxy_p99_ms']):>9} "
            f"{fmt(r['floor_rps'], '.0f'):>9} {fmt(r['proxy_rps'], '.0f'):>9} "
            f"{fmt(r['ratio'] * 100, '.0f') + '%':>6} {fmt(r['cpu_per_1k'], '.3f'):>8} "
            f"{fmt(r['machine_busy'] * 100, '.0f') + '%':>5} {r['errors']:>4}")  # fmt: skip


def print_rows(rows: list[dict]) -> None:
    head = (f"{'proxy':>8} {'streams':>7} {'floor p50':>9} {'proxy p50':>9} {'added p50':>9} "
            f"{'floor p99':>9} {'proxy p99':>9} {'floor rps':>9} {'proxy rps':>9} {'ratio':>6} "
            f"{'CPU-s/1k':>8} {'busy':>5} {'err':>4}")  # fmt: skip
    print_table(head, map(_row, rows))
    print(
        "(ms; rps = completed requests/s; ratio = proxy rps / floor rps; CPU-s/1k = proxy "
        "process CPU seconds per 1,000 requests; busy = whole-machine CPU use during runs)"
    )


def print_paired(pairs: list[dict]) -> None:
    for p in pairs:
        lo, hi = p["cpu_ratio_range"]
        rlo, rhi = p["rps_ratio_range"]
        print(f"  vs {p['baseline']} at {p['streams']:>3} streams: CPU/request x"
              f"{p['cpu_ratio']:.3f} (rounds {lo:.3f}-{hi:.3f}), rps x{p['rps_ratio']:.3f} "
              f"({rlo:.3f}-{rhi:.3f}), added p50 {p['added_p50_diff_ms']:+.3f} ms")  # fmt: skip


def checks_of(rows: list[dict]) -> list[tuple[str, bool]]:
    by = {r["streams"]: r for r in rows if r["proxy"] == "proxy"}
    checks = []
    for s in (1, 16):
        if s in by:
            checks.append((f"added p50 at {s} stream(s) <= 1 ms", by[s]["added_p50_ms"] <= 1.0))
    if 16 in by:
        checks.append((">= 90% of floor throughput at 16 streams", by[16]["ratio"] >= 0.9))
    if 128 in by:
        checks.append((">= 1,000 req/s at 128 streams", by[128]["proxy_rps"] >= 1000))
        checks.append(("<= 0.8 proxy CPU-s per 1,000 requests (128 streams)",
                       by[128]["cpu_per_1k"] <= 0.8))  # fmt: skip
    return checks


def print_profile(profile_path: str) -> None:
    print("\nWhere the proxy's CPU goes (cProfile, top 25 by own time, whole run):")
    stats = pstats.Stats(profile_path)
    total = stats.total_tt  # type: ignore[attr-defined]
    loop_own = sum(
        tt
        for (file, _, fn), (_, _, tt, _, _) in stats.stats.items()  # type: ignore[attr-defined]
        if fn == "run" and file.endswith("runners.py")
    )
    print(
        f"{total:.2f} s profiled; {loop_own / total:.0%} inside the event loop's C code "
        "(uvloop: epoll, recv/send, accept), the rest in Python:"
    )
    stats.sort_stats("tottime").print_stats(25)
    os.unlink(profile_path)


def main() -> None:
    stop_on_termination()  # SIGTERM/SIGHUP run the cleanup below, as Ctrl-C does
    args = parse_args()
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        print("uvloop not installed: the load generator runs on plain asyncio", file=sys.stderr)

    global KEYED
    KEYED = args.client_key
    baselines = [(n, Path(d).resolve()) for n, _, d in (b.partition("=") for b in args.baseline)]
    profile_path = tempfile.mktemp(suffix=".prof") if args.profile else None
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    procs: list[subprocess.Popen] = []
    rows = []
    try:
        ports, targets = start_processes(profile_path, args.chunk_gap_ms, procs, baselines)
        for streams in args.streams:
            runs = measure(ports, targets, streams, args)
            rows += [row_of(t.name, streams, runs["floor"], runs[t.name]) for t in targets]
    finally:
        stop_processes(procs)
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    print(f"\nkvpd proxy overhead: {args.reps} reps x {args.duration:g} s per cell, medians; "
          f"{os.cpu_count()} CPUs; loadavg before {' '.join(load_before)}, after "
          f"{' '.join(load_after)}; decode chunk gap {args.chunk_gap_ms:g} ms"
          f"{'; PROXY UNDER cProfile' if args.profile else ''}")  # fmt: skip
    print_rows(rows)
    pairs = [p for name, _ in baselines for p in paired(rows, name)]
    print_paired(pairs)
    checks = checks_of(rows)
    for name, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if profile_path and os.path.exists(profile_path):
        print_profile(profile_path)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "paired": pairs, "checks": checks}, indent=2)
        )


if __name__ == "__main__":
    main()
