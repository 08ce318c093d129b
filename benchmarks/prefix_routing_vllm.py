"""Cache-aware vs least-loaded routing on CPU vLLM, side by side in one run: the same engines
(one deployment of `local` with two prefill instances and one decoder), the same prompts, the
UCM guide's prefix protocol (seed each prompt's first 80% with one output token, then send
the full prompts and measure), each policy through its own `kvpd proxy` in front of those
engines (a fresh proxy for every repetition), in the order A B B A so drift in machine load
hits both alike.

Before every repetition each engine's prefix cache is emptied (POST /reset_prefix_cache; the
engines run with VLLM_SERVER_DEV_MODE=1, which serves it), so each policy starts from the
same state. The prompts are token ids (the tiny model's vocabulary), so the seeded share is
exact: 256 of 320 tokens, 8 whole blocks of 32, an ideal hit ratio of 0.8. The hit ratio is
the prefill engines' vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total in the
measured phase; TTFT is the time to the first streamed token at the client; the cache-aware
proxy's index capacity is the one it learned from the engines (source="engine"). Each engine
first serves one uncached request of its own, so no policy pays a fresh engine's first batch.

    flock /tmp/kvpd-bed.lock flock /tmp/kvpd-bench.lock \\
        .venv/bin/python benchmarks/prefix_routing_vllm.py [--prompts 40] [--reps 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import ROOT, free_port, stop_processes, wait_http  # the shared helpers

from kvpd.bench.metrics import parse, total

POLICIES = ("cache-aware", "least-loaded")
SETS = (
    "prefill.instances=2",
    "hosts.localhost.devices=3",  # a core each for the prefillers; decode shares core 1
    "decode.env.VLLM_CPU_OMP_THREADS_BIND=1",
    "prefill.env.VLLM_SERVER_DEV_MODE=1",  # /reset_prefix_cache between repetitions
    "decode.env.VLLM_SERVER_DEV_MODE=1",
)
VOCAB = (5, 480)  # token ids the tiny model has (vocabulary of 487)


def kvpd(*argv: str, capture: bool = False) -> str:
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv-engine' / 'bin'}:{ROOT / '.venv' / 'bin'}:{env['PATH']}"
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "kvpd"), *argv], cwd=ROOT, env=env,
                         check=True, text=True, capture_output=capture)  # fmt: skip
    return out.stdout if capture else ""


def engine_ports(sets: list[str]) -> tuple[list[int], list[int]]:
    plan = json.loads(kvpd("plan", "local", *(f"--set={s}" for s in sets), "--json",
                           capture=True))  # fmt: skip
    http_ports = {p["owner"]: p["port"] for p in plan["ports"] if p["purpose"] == "http"}
    prefill = [port for owner, port in sorted(http_ports.items()) if owner.startswith("prefill")]
    decode = [port for owner, port in sorted(http_ports.items()) if owner.startswith("decode")]
    return prefill, decode


def start_proxy(policy: str, prefill: list[int], decode: list[int]) -> tuple[int, subprocess.Popen]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpd.proxy", "--port", str(port),
         "--prefiller-hosts", *["127.0.0.1"] * len(prefill),
         "--prefiller-ports", *map(str, prefill),
         "--decoder-hosts", *["127.0.0.1"] * len(decode), "--decoder-ports", *map(str, decode),
         "--routing", policy, "--log-level", "WARNING"],
        cwd=ROOT,
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health")
    return port, proc


def post(port: int, path: str, body: dict | None = None, timeout: float = 120.0) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def metrics(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse(r.read().decode())


def one(port: int, ids: list[int], out: int) -> tuple[float, float]:
    """(TTFT, E2E) in seconds of one streamed completion."""
    body = {"model": "tiny", "prompt": ids, "max_tokens": out, "min_tokens": out,
            "ignore_eos": True, "stream": True}  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"the proxy answered HTTP {resp.status}: {resp.read()[:300]!r}")
    first = 0.0
    for line in resp:
        if not first and line.startswith(b"data: {"):
            first = time.perf_counter() - t0
    conn.close()
    return first, time.perf_counter() - t0


def phase(port: int, prompts: list[list[int]], out: int, conc: int) -> list[tuple[float, float]]:
    with ThreadPoolExecutor(conc) as pool:
        return list(pool.map(lambda ids: one(port, ids, out), prompts))


def hits(prefill: list[int]) -> tuple[float, float, list[float]]:
    got = [metrics(p) for p in prefill]
    h = sum(total(m, "vllm:prefix_cache_hits_total") for m in got)
    q = sum(total(m, "vllm:prefix_cache_queries_total") for m in got)
    return h, q, [total(m, "vllm:request_success_total") for m in got]


def run_rep(policy: str, proxy: int, engines: tuple[list[int], list[int]], prompts: list[list[int]],
            args: argparse.Namespace) -> dict:  # fmt: skip
    prefill, decode = engines
    for port in prefill + decode:
        post(port, "/reset_prefix_cache")
    seed_len = int(args.input_len * args.ratio)
    phase(proxy, [p[:seed_len] for p in prompts], 1, args.concurrency)
    h0, q0, r0 = hits(prefill)
    lat = phase(proxy, prompts, args.output_len, args.concurrency)
    h1, q1, r1 = hits(prefill)
    ttft = sorted(t for t, _ in lat)
    return {
        "policy": policy,
        "hit_ratio": (h1 - h0) / max(1.0, q1 - q0),
        "ttft_mean_ms": statistics.mean(ttft) * 1e3,
        "ttft_p50_ms": statistics.median(ttft) * 1e3,
        "ttft_p99_ms": ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))] * 1e3,
        "e2el_mean_ms": statistics.mean(e for _, e in lat) * 1e3,
        "per_prefiller": [b - a for a, b in zip(r0, r1, strict=True)],
    }


def _learned(port: int) -> dict[str, float]:
    """The capacity each prefill index was sized to from its engine (0: not learned)."""
    m = metrics(port)
    return {b: total(m, "kvpd_proxy_prefix_index_capacity_tokens", backend=b, source="engine")
            for b in ("prefill-0", "prefill-1")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--input-len", type=int, default=320)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--ratio", type=float, default=0.8, help="seeded share of each prompt")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each policy (A B B A)")
    ap.add_argument("--no-up", action="store_true", help="the deployment is already up")
    ap.add_argument("--keep-up", action="store_true")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    sets = list(SETS)
    if not args.no_up:
        kvpd("up", "local", "--yes", *(f"--set={s}" for s in sets))
    engines = engine_ports(sets)
    rng = random.Random(0)
    prompts = [[rng.randrange(*VOCAB) for _ in range(args.input_len)] for _ in range(args.prompts)]
    warm = [rng.randrange(*VOCAB) for _ in range(args.input_len)]
    for port in engines[0] + engines[1]:  # first-request effects stay out of the figures
        post(port, "/v1/completions", {"model": "tiny", "prompt": warm, "max_tokens": 2})
    rows: list[dict] = []
    learned: dict[str, float] = {}
    try:
        for rep in range(args.reps):
            for policy in POLICIES if rep % 2 == 0 else reversed(POLICIES):
                # a fresh proxy each time: its index starts empty, as the engines' caches do
                port, proc = start_proxy(policy, *engines)
                try:
                    rows.append(run_rep(policy, port, engines, prompts, args))
                    if policy == "cache-aware":
                        learned = _learned(port)
                finally:
                    stop_processes([proc])
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if not args.keep_up and not args.no_up:
            kvpd("down", "local")
    report(rows, learned, args)


def report(rows: list[dict], learned: dict, args: argparse.Namespace) -> None:
    print(f"\nprefix protocol on CPU vLLM (local, 2 prefill + 1 decode): {args.prompts} prompts "
          f"of {args.input_len} token ids, seed {args.ratio:.0%}, output {args.output_len}, "
          f"concurrency {args.concurrency}")  # fmt: skip
    head = f"{'policy':<13} {'hit':>6} {'TTFT mean':>10} {'p50':>8} {'p99':>8} {'E2EL':>8}  per P"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['policy']:<13} {r['hit_ratio']:>6.3f} {r['ttft_mean_ms']:>10.1f} "
              f"{r['ttft_p50_ms']:>8.1f} {r['ttft_p99_ms']:>8.1f} {r['e2el_mean_ms']:>8.1f}  "
              f"{' '.join(str(int(x)) for x in r['per_prefiller'])}")  # fmt: skip
    med = {p: {k: statistics.median(r[k] for r in rows if r["policy"] == p)
               for k in ("hit_ratio", "ttft_mean_ms", "ttft_p50_ms", "e2el_mean_ms")}
           for p in POLICIES}  # fmt: skip
    ca, ll = med["cache-aware"], med["least-loaded"]
    print(f"medians: hit ratio {ca['hit_ratio']:.3f} vs {ll['hit_ratio']:.3f}; TTFT mean "
          f"{ca['ttft_mean_ms']:.1f} vs {ll['ttft_mean_ms']:.1f} ms "
          f"({ca['ttft_mean_ms'] / ll['ttft_mean_ms']:.2f}x), p50 {ca['ttft_p50_ms']:.1f} vs "
          f"{ll['ttft_p50_ms']:.1f} ms")  # fmt: skip
    print(f"cache-aware index capacity learned from the engines: {learned}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "medians": med, "learned": learned},
                                              indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
