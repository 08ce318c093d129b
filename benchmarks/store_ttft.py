"""TTFT with kvpd's store connector vs recompute, vLLM prefix caching and ExampleConnector, plus
the store's raw read/write throughput against plain sequential file I/O on the same disk.

Protocol (the UCM guide's): per scenario, deploy two PD-mixed CPU instances behind kvpd's proxy
(mixed flow), seed with `vllm bench serve` at 0.8 x the input length (output 1), then measure at
the full input length, both through the proxy. At concurrency 1 the proxy alternates between the
instances; the phases are offset by one request so that every measured prompt lands on the
instance that did not see its seed: the case where a balancer sends the request elsewhere. Same
--seed for both runs, so each measured prompt starts with its seed prompt.

    .venv/bin/python benchmarks/store_ttft.py --input-lens 1024 --num-prompts 8
    .venv/bin/python benchmarks/store_ttft.py --throughput-only

Needs the CPU engine (.venv-engine) and builds `.kvpd/models/store-bench` (hidden 1024, 16
layers, ~300 MB of random weights) if missing, so prefill compute dominates TTFT.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvpd.connectors.blockstore import BlockStore  # noqa: E402
from kvpd.testing.termination import stop_on_termination  # noqa: E402

ENGINE = REPO / ".venv-engine"
MODEL = REPO / ".kvpd" / "models" / "store-bench"
SCENARIOS = {
    # name: (kv_connectors, prefix caching)
    "recompute": ("[]", False),
    "vllm-prefix-cache": ("[]", True),
    "kvpd-store": ("[kvpd_store]", True),
    "example-connector": ("[example]", True),
}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = f"{ENGINE / 'bin'}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, **kw)


def kvpd(*args: str, check: bool = True) -> None:
    r = run([sys.executable, "-m", "kvpd.cli.main", *args], timeout=1200)
    if check and r.returncode:
        raise SystemExit(
            f"kvpd {' '.join(args[:2])} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )


def metric(url: str, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def bench_serve(url: str, input_len: int, output_len: int, n: int, seed: int, out: Path) -> dict:
    cmd = [
        str(ENGINE / "bin" / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", url,
        "--model", "tiny", "--tokenizer", str(MODEL), "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(n), "--seed", str(seed), "--ignore-eos", "--disable-tqdm",
        "--max-concurrency", "1", "--save-result", "--result-dir", str(out.parent),
        "--result-filename", out.name,
    ]  # fmt: skip
    r = run(cmd, timeout=3600)
    if r.returncode:
        raise SystemExit(f"vllm bench serve failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def scenario(name: str, input_len: int, args: argparse.Namespace, work: Path) -> dict:
    comps, prefix = SCENARIOS[name]
    dep = f"stb-{name}"
    port = args.port
    kv = work / name / "kv"
    kv.mkdir(parents=True, exist_ok=True)
    sets = [
        f"name={dep}", f"runtime.run_dir=.kvpd/{dep}/run",
        f"proxy={{host: localhost, port: {port}}}",  # kvpd proxy, mixed flow over A and B
        "prefill=null", "decode=null",
        f"mixed={{hosts: [localhost], instances: 2, port: {port + 100}, kv_connectors: {comps}}}",
        f"model.path={MODEL.relative_to(REPO)}", "model.layers=16", "model.kv_heads=16",
        "model.head_dim=32", "model.max_model_len=2048", "engine.max_model_len=2048",
        "engine.max_num_batched_tokens=4096", "engine.kv_cache_memory_bytes=512M",
        f"engine.enable_prefix_caching={'true' if prefix else 'false'}",
        f"kv.kvpd_store.path={kv}", f"kv.example_path={kv}",
    ]  # fmt: skip
    kvpd("down", "--deployment", dep, check=False)
    a, b = f"http://127.0.0.1:{port + 100}", f"http://127.0.0.1:{port + 101}"
    proxy = f"http://127.0.0.1:{port}"
    try:  # from `up` on: stopped half way, `down` still stops what it started
        t0 = time.monotonic()
        kvpd("up", "local", "--yes", *[x for s in sets for x in ("--set", s)])
        up_s = time.monotonic() - t0
        seed_len = int(input_len * 0.8)
        # Both phases go through the proxy, which alternates between A and B at concurrency 1.
        # One extra request between the phases shifts that alternation, so every measured
        # request lands on the instance that did NOT see its prefix: the DP situation of the
        # guide, where only a shared store can still hit.
        bench_serve(proxy, seed_len, 1, args.num_prompts, args.seed, work / name / "seed.json")
        if args.num_prompts % 2 == 0:
            bench_serve(proxy, 64, 1, 1, args.seed + 1, work / name / "shift.json")
        ext0 = sum(metric(u, "vllm:prompt_tokens_by_source_total",
                          source="external_kv_transfer") for u in (a, b))  # fmt: skip
        hit0 = sum(metric(u, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
                   for u in (a, b))  # fmt: skip
        res = bench_serve(proxy, input_len, args.output_len, args.num_prompts, args.seed,
                          work / name / "measure.json")  # fmt: skip
        ext = sum(metric(u, "vllm:prompt_tokens_by_source_total",
                         source="external_kv_transfer") for u in (a, b)) - ext0  # fmt: skip
        hit = sum(metric(u, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
                  for u in (a, b)) - hit0  # fmt: skip
    finally:
        kvpd("down", "--deployment", dep, check=False)
    return {
        "scenario": name, "input_len": input_len, "mean_ttft_ms": res["mean_ttft_ms"],
        "median_ttft_ms": res["median_ttft_ms"], "input_tokens": res["total_input_tokens"],
        "hbm_hit_tokens": hit, "external_tokens": ext, "up_s": round(up_s, 1),
    }  # fmt: skip


def throughput(folder: Path, block_bytes: int, blocks: int, io_threads: int) -> dict:
    """Store put/get of `blocks` blocks vs one sequential file write/read/copy of the bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    data = [os.urandom(block_bytes) for _ in range(min(blocks, 16))]
    payloads = [data[i % len(data)] for i in range(blocks)]
    total = block_bytes * blocks
    store_dir = folder / "store"
    store_dir.mkdir()
    store = BlockStore(store_dir, "bench", io_threads=io_threads)
    keys = [i.to_bytes(32, "big") for i in range(blocks)]
    t = time.perf_counter()
    store.put_many(zip(keys, payloads, strict=True))
    w_store = time.perf_counter() - t
    reader = BlockStore(store_dir, "bench", io_threads=io_threads)
    # Read like the connector does: a request's blocks at a time, straight into the rows of one
    # staging buffer (which the connector then scatters into the paged KV cache).
    batch = 16
    staging = bytearray(batch * block_bytes)
    rows = [memoryview(staging)[i * block_bytes : (i + 1) * block_bytes] for i in range(batch)]
    t = time.perf_counter()
    found = 0
    for i in range(0, blocks, batch):
        ks = keys[i : i + batch]
        found += sum(reader.get_many_into(ks, rows[: len(ks)]))
    r_store = time.perf_counter() - t
    assert found == blocks
    plain = folder / "plain.bin"
    t = time.perf_counter()
    with open(plain, "wb") as f:
        for p in payloads:
            f.write(p)
    w_plain = time.perf_counter() - t
    t = time.perf_counter()
    with open(plain, "rb") as f:
        while f.read(8 << 20):
            pass
    r_plain = time.perf_counter() - t
    t = time.perf_counter()
    shutil.copyfile(plain, folder / "copy.bin")
    c_plain = time.perf_counter() - t
    store.close()
    reader.close()
    mb = total / 1e6
    out = {
        "bytes": total, "block_bytes": block_bytes, "io_threads": io_threads,
        "store_write_MBps": mb / w_store, "store_read_MBps": mb / r_store,
        "plain_write_MBps": mb / w_plain, "plain_read_MBps": mb / r_plain,
        "plain_copy_MBps": mb / c_plain,
    }  # fmt: skip
    out["write_vs_copy"] = out["store_write_MBps"] / out["plain_copy_MBps"]
    out["read_vs_copy"] = out["store_read_MBps"] / out["plain_copy_MBps"]
    out["write_vs_plain_write"] = out["store_write_MBps"] / out["plain_write_MBps"]
    out["read_vs_plain_read"] = out["store_read_MBps"] / out["plain_read_MBps"]
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    stop_on_termination()  # SIGTERM/SIGHUP run the cleanup below, as Ctrl-C does
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-lens", default="1024", help="comma-separated input lengths")
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=123456)
    ap.add_argument("--port", type=int, default=19700)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--throughput-only", action="store_true")
    ap.add_argument("--throughput-runs", type=int, default=5)
    ap.add_argument("--work", default=str(REPO / ".kvpd" / "store-bench-work"))
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # Page-cache writes are throttled by earlier dirty data and other processes: flush first and
    # take the median of several interleaved runs.
    runs = []
    for _ in range(args.throughput_runs):
        os.sync()
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            runs.append(throughput(Path(tmp), block_bytes=1 << 20, blocks=256, io_threads=4))
    tp = {k: (statistics.median(r[k] for r in runs) if isinstance(runs[0][k], float) else
              runs[0][k]) for k in runs[0]}  # fmt: skip
    tp["runs"] = len(runs)
    print("store throughput (1 MiB blocks, 256 MiB, median):", json.dumps(tp))
    if args.throughput_only:
        return

    if not (ENGINE / "bin" / "vllm").exists():
        raise SystemExit(f"CPU engine missing at {ENGINE}")
    if not (MODEL / "config.json").exists():
        kvpd("model", "tiny", str(MODEL), "--hidden-size", "1024", "--layers", "16")
    rows = []
    for input_len in (int(x) for x in args.input_lens.split(",")):
        for name in args.scenarios.split(","):
            row = scenario(name, input_len, args, work)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'scenario':<20} {'input':>6} {'mean TTFT ms':>13} {'vs recompute':>13} "
          f"{'HBM-hit tok':>12} {'external tok':>13}")  # fmt: skip
    base = {r["input_len"]: r["mean_ttft_ms"] for r in rows if r["scenario"] == "recompute"}
    for r in rows:
        ratio = r["mean_ttft_ms"] / base[r["input_len"]] if r["input_len"] in base else float("nan")
        print(f"{r['scenario']:<20} {r['input_len']:>6} {r['mean_ttft_ms']:>13.1f} {ratio:>13.2f} "
              f"{r['hbm_hit_tokens']:>12.0f} {r['external_tokens']:>13.0f}")  # fmt: skip
    (work / "results.json").write_text(json.dumps({"throughput": tp, "ttft": rows}, indent=2))
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
