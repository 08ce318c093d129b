"""Cache-aware vs least-loaded routing of prefillers, side by side in one run, through `kvpd
proxy` in front of stand-in engines (kvpd/testing/standin_engine.py: a block-hash prefix cache
of limited capacity, LRU, with vLLM's prefix-cache counters on /metrics), with 2 and 4
prefill instances and one decoder.

- guide: the UCM guide's protocol: seed each prompt's first 80%, then send the full prompts;
  the hit ratio of the second phase from the prefill engines' /metrics (ideal: 0.8);
- random: no shared prefixes (every prompt random): throughput, p99 and the proxy's CPU
  seconds per request; both proxies run at once in front of the same engines and every
  stream alternates its requests between them, so machine load hits both alike;
- skew: 80% of requests start with one of two long system prompts (then a random eighth),
  the rest random, on engines whose cache holds 2.5 such prompts: requests per prefiller
  max/mean and the hit ratio.

Each run starts fresh engines and a fresh proxy; the guide's engine cache holds 1.25 times an
engine's share of the full prompts (the proxy's index is sized the same: --prefix-capacity-
tokens = cache blocks x block size).

    .venv/bin/python benchmarks/prefix_routing.py [--prefill 2 4] [--prompts 96] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import (  # the benchmarks' lean client, shared
    ROOT,
    connect,
    free_port,
    proc_cpu_seconds,
    request_bytes,
    stop_processes,
    wait_http,
)
from result_table import print_table

from kvpd.bench.metrics import parse, total

ENGINE = ROOT / "kvpd" / "testing" / "standin_engine.py"
POLICIES = ("least-loaded", "cache-aware")
BLOCK = 16  # tokens per KV block (vLLM's default on CPU); the stand-in counts 4 chars a token
ALPHABET = "abcdefghijklmnopqrstuvwxyz     "


def text(rng: random.Random, chars: int) -> str:
    return "".join(rng.choices(ALPHABET, k=chars))


def start_engines(n: int, cache_blocks: int) -> tuple[list[int], int, list[subprocess.Popen]]:
    procs, ports = [], []
    for role in ["prefill"] * n + ["decode"]:
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, str(ENGINE), "--host", "127.0.0.1", "--port", str(port), "--role",
             role, "--block-size", str(BLOCK), "--cache-blocks", str(cache_blocks)],
            stdout=subprocess.DEVNULL,
        ))  # fmt: skip
        ports.append(port)
    for port in ports:
        wait_http(f"http://127.0.0.1:{port}/health")
    return ports[:-1], ports[-1], procs


def start_proxy(
    policy: str, prefill: list[int], decode: int, cache_blocks: int, extra: list[str]
) -> tuple:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpd.proxy", "--port", str(port),
         "--prefiller-hosts", *["127.0.0.1"] * len(prefill),
         "--prefiller-ports", *map(str, prefill), "--decoder-ports", str(decode),
         "--routing", policy,
         "--prefix-capacity-tokens", str(cache_blocks * BLOCK), "--log-level", "WARNING", *extra],
        cwd=ROOT,
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health")
    return port, proc


def post(url: str) -> None:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10):
        pass


def scrape(ports: list[int]) -> tuple[float, float, list[float]]:
    """Summed prefix-cache hits and queries (tokens) and the requests of each engine."""
    hits = queries = 0.0
    reqs = []
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            s = parse(r.read().decode())
        hits += total(s, "vllm:prefix_cache_hits_total")
        queries += total(s, "vllm:prefix_cache_queries_total")
        reqs.append(total(s, "vllm:request_success_total"))
    return hits, queries, reqs


async def send_all(port: int, prompts: list[str], streams: int) -> list[float]:
    """Every prompt once, `streams` at a time; the latency of each request."""
    conns = [await connect(port) for _ in range(streams)]
    queue = list(reversed(prompts))
    lat: list[float] = []

    async def worker(c) -> None:  # type: ignore[no-untyped-def]
        while queue:
            body = {"model": "standin", "prompt": queue.pop(), "max_tokens": 4, "stream": True}
            t0 = time.perf_counter()
            status = await c.call(request_bytes(port, "/v1/completions", body))
            if status != 200:
                raise SystemExit(f"the proxy answered HTTP {status}")
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        c.transport.close()
    return lat


def phase(proxy: int, prefill: list[int], prompts: list[str], streams: int) -> dict:
    h0, q0, r0 = scrape(prefill)
    t0 = time.perf_counter()
    lat = asyncio.run(send_all(proxy, prompts, streams))
    wall = time.perf_counter() - t0
    h1, q1, r1 = scrape(prefill)
    per = [b - a for a, b in zip(r0, r1, strict=True)]
    s = sorted(lat)
    return {
        "hit_ratio": (h1 - h0) / max(1.0, q1 - q0),
        "rps": len(lat) / wall,
        "p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3,
        "per_backend": per,
        "max_over_mean": max(per) / max(1e-9, statistics.mean(per)),
    }


def scenario_prompts(kind: str, rng: random.Random, n: int, chars: int) -> list[list[str]]:
    """The phases of a scenario, each a list of prompts."""
    if kind == "guide":
        full = [text(rng, chars) for _ in range(n)]
        order = list(full)
        rng.shuffle(order)
        return [[p[: int(chars * 0.8)] for p in full], order]
    if kind == "random":
        return [[text(rng, chars) for _ in range(n)]]
    systems = [text(rng, chars) for _ in range(2)]
    out = []
    for _ in range(n):
        suffix = text(rng, chars // 8)
        out.append(rng.choice(systems) + suffix if rng.random() < 0.8 else text(rng, chars))
    return [out]


def run_policy(policy: str, n: int, args: argparse.Namespace, kind: str, seed: int) -> dict:
    cache_blocks = args.cache_blocks
    prefill, decode, procs = start_engines(n, cache_blocks)
    proxy, pproc = start_proxy(policy, prefill, decode, cache_blocks, args.proxy_arg)
    try:
        count = {"guide": args.prompts, "random": args.random_prompts, "skew": args.skew_prompts}
        phases = scenario_prompts(kind, random.Random(seed), count[kind], args.chars)
        cpu0 = proc_cpu_seconds(pproc.pid)
        results = [phase(proxy, prefill, p, args.streams) for p in phases]
        cpu = proc_cpu_seconds(pproc.pid) - cpu0
        out = results[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy}/metrics", timeout=10) as r:
            m = parse(r.read().decode())
        out["decisions"] = {
            why: int(total(m, "kvpd_proxy_routing_decisions_total", reason=why))
            for why in ("prefix_match", "balance_override", "no_match")
        }
        out["proxy_cpu_ms_per_request"] = cpu / sum(len(p) for p in phases) * 1e3
        if kind == "guide":
            out["seed_hit_ratio"] = results[0]["hit_ratio"]
        return out
    finally:
        stop_processes([pproc, *procs])


async def send_interleaved(
    ports: dict[str, int], prompts: list[str], streams: int
) -> dict[str, list[float]]:
    """Each stream sends its prompts alternately through each proxy (the order swapped every
    time), so both see the same machine at the same moments; the latencies per proxy."""
    conns = [{p: await connect(port) for p, port in ports.items()} for _ in range(streams)]
    queue = list(reversed(prompts))
    lat: dict[str, list[float]] = {p: [] for p in ports}

    async def worker(cs: dict) -> None:  # type: ignore[type-arg]
        turn = 0
        while queue:
            order = list(ports) if turn % 2 == 0 else list(reversed(ports))
            turn += 1
            for policy in order:
                if not queue:
                    return
                body = {"model": "standin", "prompt": queue.pop(), "max_tokens": 4,
                        "stream": True}  # fmt: skip
                t0 = time.perf_counter()
                status = await cs[policy].call(request_bytes(ports[policy], "/v1/completions",
                                                             body))  # fmt: skip
                if status != 200:
                    raise SystemExit(f"the {policy} proxy answered HTTP {status}")
                lat[policy].append(time.perf_counter() - t0)

    await asyncio.gather(*(worker(c) for c in conns))
    for cs in conns:
        for c in cs.values():
            c.transport.close()
    return lat


def run_interleaved(n: int, args: argparse.Namespace, seed: int) -> dict[str, dict]:
    """The random scenario: both proxies in front of the same engines at once, requests
    interleaved. Throughput per proxy: its requests over its time, by Little's law."""
    prefill, decode, procs = start_engines(n, args.cache_blocks)
    proxies = {p: start_proxy(p, prefill, decode, args.cache_blocks, args.proxy_arg)
               for p in POLICIES}  # fmt: skip
    try:
        prompts = scenario_prompts("random", random.Random(seed), args.random_prompts * 2,
                                   args.chars)[0]  # fmt: skip
        cpu0 = {p: proc_cpu_seconds(proc.pid) for p, (_, proc) in proxies.items()}
        lat = asyncio.run(send_interleaved({p: port for p, (port, _) in proxies.items()},
                                           prompts, args.streams))  # fmt: skip
        out = {}
        for policy, (port, proc) in proxies.items():
            cpu = proc_cpu_seconds(proc.pid) - cpu0[policy]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                m = parse(r.read().decode())
            per = [total(m, "kvpd_proxy_backend_requests_total", role="prefill",
                         backend=f"prefill-{i}") for i in range(n)]  # fmt: skip
            ls = sorted(lat[policy])
            out[policy] = {
                "hit_ratio": float("nan"),
                "rps": len(ls) * args.streams / 2 / sum(ls),
                "p99_ms": ls[min(len(ls) - 1, int(len(ls) * 0.99))] * 1e3,
                "p50_ms": statistics.median(ls) * 1e3,
                "per_backend": per,
                "max_over_mean": max(per) / max(1e-9, statistics.mean(per)),
                "proxy_cpu_ms_per_request": cpu / len(ls) * 1e3,
                "decisions": {
                    why: int(total(m, "kvpd_proxy_routing_decisions_total", reason=why))
                    for why in ("prefix_match", "balance_override", "no_match")
                },
            }
        return out
    finally:
        stop_processes([proc for _, proc in proxies.values()] + procs)


def in_process(prefill: list[int], prompts: int, chars: int) -> None:
    """The routing's own CPU per request, without sockets: the prompt's keys and the choice
    (least-loaded: the choice only), best of 7 passes over random prompts."""
    from kvpd.proxy.backends import Backend, BackendPool
    from kvpd.proxy.cache_aware import CacheAware
    from kvpd.proxy.hostpool import HostPool
    from kvpd.proxy.prefix_index import prefix_keys

    rng = random.Random(0)
    bodies = [{"model": "standin", "prompt": text(rng, chars), "max_tokens": 4}
              for _ in range(prompts)]  # fmt: skip
    loop = asyncio.new_event_loop()
    for n in prefill:
        best: dict[str, float] = {}
        for _ in range(7):
            for policy in POLICIES:
                backends = [Backend(HostPool("127.0.0.1", 1 + i, loop, 1.0, f"prefill-{i}"))
                            for i in range(n)]  # fmt: skip
                pool = BackendPool("prefill", backends, loop)
                if policy == "cache-aware":
                    pool.policy = CacheAware(backends, 32768, 32, 4096, 1.5)
                t0 = time.perf_counter()
                for body in bodies:
                    keys = prefix_keys(body, 32) if pool.policy is not None else ()
                    b = pool.pick((), keys)
                    assert b is not None
                    b.begin(100)
                    b.end(100)
                us = (time.perf_counter() - t0) / len(bodies) * 1e6
                best[policy] = min(best.get(policy, us), us)
        print(f"P={n} in-process routing per request: cache-aware {best['cache-aware']:.2f} us, "
              f"least-loaded {best['least-loaded']:.2f} us")  # fmt: skip
    loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--prompts", type=int, default=96, help="prompts per phase (guide)")
    ap.add_argument("--random-prompts", type=int, default=1500)
    ap.add_argument("--skew-prompts", type=int, default=400)
    ap.add_argument("--chars", type=int, default=4096, help="characters a prompt (4 a token)")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the random scenario")
    ap.add_argument(
        "--cache-blocks",
        type=int,
        default=0,
        help="blocks each engine's prefix cache holds (0: 1.25 x its share of the full "
        "prompts of the guide scenario)",
    )
    ap.add_argument(
        "--skew-cache-blocks",
        type=int,
        default=160,
        help="the skew scenario's engine cache: 2.5 system prompts, so that what an engine "
        "is sent decides what it keeps",
    )
    ap.add_argument("--scenarios", nargs="+", default=["guide", "random", "skew"])
    ap.add_argument(
        "--proxy-arg", action="append", default=[], help="extra `kvpd proxy` flag (repeatable)"
    )
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="only the routing's own CPU per request (keys and choice, no sockets)",
    )
    args = ap.parse_args()
    if args.in_process:
        in_process(args.prefill, 3000, args.chars)
        return
    rows = []
    given = args.cache_blocks
    for n in args.prefill:
        blocks_per_prompt = args.chars // 4 // BLOCK
        for kind in args.scenarios:
            args.cache_blocks = given or (
                args.skew_cache_blocks
                if kind == "skew"
                else int(1.25 * args.prompts * blocks_per_prompt / n)
            )
            reps = args.reps if kind == "random" else 1
            runs: dict[str, list[dict]] = {p: [] for p in POLICIES}
            for rep in range(reps):  # alternate so drift in machine load hits both
                if kind == "random":
                    for policy, result in run_interleaved(n, args, 1000 * n + rep).items():
                        runs[policy].append(result)
                    continue
                for policy in POLICIES if rep % 2 == 0 else reversed(POLICIES):
                    runs[policy].append(run_policy(policy, n, args, kind, 1000 * n + rep))
            for policy in POLICIES:
                med = {k: statistics.median(r[k] for r in runs[policy])
                       for k in ("hit_ratio", "rps", "p99_ms", "max_over_mean",
                                 "proxy_cpu_ms_per_request")}  # fmt: skip
                for k in ("p99_ms", "rps", "proxy_cpu_ms_per_request"):
                    med["all_" + k] = [round(r[k], 3) for r in runs[policy]]
                med["per_backend"] = runs[policy][0]["per_backend"]
                med["decisions"] = runs[policy][0]["decisions"]
                rows.append({"prefill": n, "scenario": kind, "policy": policy,
                             "cache_blocks": args.cache_blocks, **med})  # fmt: skip
    report(rows, args)


def _row(r: dict) -> str:
    return (f"{r['prefill']:>2} {r['scenario']:<8} {r['policy']:<13} {r['cache_blocks']:>6} "
            f"{r['hit_ratio']:>6.3f} {r['rps']:>7.1f} {r['p99_ms']:>8.1f} "
            f"{r['max_over_mean']:>8.2f} {r['proxy_cpu_ms_per_request']:>10.3f}  "
            f"{' '.join(str(int(x)) for x in r['per_backend'])}"
            + ("  match/override/none " + "/".join(map(str, r["decisions"].values()))
               if r["policy"] == "cache-aware" else ""))  # fmt: skip


def report(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"\nprefix routing: {args.prompts} prompts a phase of {args.chars} chars "
          f"(~{args.chars // 4} tokens), {args.streams} streams, block {BLOCK}")  # fmt: skip
    head = (f"{'P':>2} {'scenario':<8} {'policy':<13} {'cache':>6} {'hit':>6} {'rps':>7} "
            f"{'p99 ms':>8} {'max/mean':>8} {'CPU ms/req':>10}  per prefiller")  # fmt: skip
    print_table(head, map(_row, rows))
    by = {(r["prefill"], r["scenario"], r["policy"]): r for r in rows}
    checks = []
    for n in args.prefill if len({r["scenario"] for r in rows}) == 3 else ():
        ca, ll = by[(n, "guide", "cache-aware")], by[(n, "guide", "least-loaded")]
        checks.append((f"P={n} guide: cache-aware hit ratio {ca['hit_ratio']:.3f} >= 0.76",
                       ca["hit_ratio"] >= 0.76))  # fmt: skip
        ca, ll = by[(n, "random", "cache-aware")], by[(n, "random", "least-loaded")]
        checks.append((f"P={n} random: throughput {ca['rps'] / ll['rps']:.3f} of least-loaded "
                       ">= 0.97", ca["rps"] >= 0.97 * ll["rps"]))  # fmt: skip
        checks.append((f"P={n} random: p99 {ca['p99_ms'] / ll['p99_ms']:.3f} of least-loaded "
                       "<= 1.03", ca["p99_ms"] <= 1.03 * ll["p99_ms"]))  # fmt: skip
        cpu = ca["proxy_cpu_ms_per_request"] / ll["proxy_cpu_ms_per_request"]
        checks.append((f"P={n} random: proxy CPU per request {cpu:.3f} of least-loaded <= 1.10",
                       cpu <= 1.10))  # fmt: skip
        ca, ll = by[(n, "skew", "cache-aware")], by[(n, "skew", "least-loaded")]
        checks.append((f"P={n} skew: requests max/mean {ca['max_over_mean']:.2f} <= 1.3",
                       ca["max_over_mean"] <= 1.3))  # fmt: skip
        checks.append((f"P={n} skew: hit ratio {ca['hit_ratio']:.3f} > least-loaded's "
                       f"{ll['hit_ratio']:.3f}", ca["hit_ratio"] > ll["hit_ratio"]))  # fmt: skip
    for name, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    for n in args.prefill:
        if (n, "random", "cache-aware") not in by:
            continue
        ca, ll = by[(n, "random", "cache-aware")], by[(n, "random", "least-loaded")]
        for k in ("p99_ms", "rps", "proxy_cpu_ms_per_request"):
            per_rep = [f"{a / b:.3f}" for a, b in zip(ca["all_" + k], ll["all_" + k], strict=True)]
            print(f"  P={n} random, cache-aware / least-loaded {k} per repetition: "
                  f"{' '.join(per_rep)}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "checks": checks}, indent=2))


if __name__ == "__main__":
    main()
