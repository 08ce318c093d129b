"""What the output check costs, on the real local deployment (CPU vLLM 1P1D, kvpd's store):

- `kvpd up`'s canary with and without the check (the same canary.run, alternated, median of
  --repeats each), next to the wall time of the whole `kvpd up`;
- one bench phase (the profile's bench settings, `kvpd bench local --json`) and the output
  check the bench ran after it (the record's `outputs.seconds`);
- with --faults, each mode of the store connector's fault injection switch: the /metrics proof
  and the output check side by side (which one catches the corrupted blocks).

    flock /tmp/kvpd-bed.lock .venv/bin/python benchmarks/output_check.py --repeats 5 --faults

Needs the CPU engine (.venv-engine) and the tiny model (`make model`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvpd.bench import canary, output_check  # noqa: E402
from kvpd.exec.pool import TransportPool  # noqa: E402
from kvpd.exec.state import StateStore  # noqa: E402

ENGINE = REPO / ".venv-engine"
NAME, PORT = "bench-outputs", 18680
SETS = [
    f"name={NAME}",
    f"proxy.port={PORT}",
    f"prefill.port={PORT + 100}",
    f"decode.port={PORT + 200}",
    f"kv.kvpd_store.path=.kvpd/{NAME}/run/kv",
    f"kv.example_path=.kvpd/{NAME}/run/kv",
    f"runtime.run_dir=.kvpd/{NAME}/run",
]
FAULT = "KVPD_FAULT_CORRUPT_LOADED_BLOCKS"


def kvpd(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{ENGINE / 'bin'}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["KVPD_ENGINE_VENV"] = str(ENGINE)
    cmd = [sys.executable, "-m", "kvpd.cli.main", *args]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if check and r.returncode:
        raise SystemExit(
            f"kvpd {' '.join(args[:2])} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    return r


def sets(*more: str) -> list[str]:
    return [a for s in [*SETS, *more] for a in ("--set", s)]


def up(*more: str) -> float:
    kvpd("down", "--deployment", NAME, check=False)
    shutil.rmtree(REPO / ".kvpd" / NAME, ignore_errors=True)
    t0 = time.monotonic()
    kvpd("up", "local", "--yes", "--no-canary", *sets(*more))
    return time.monotonic() - t0


def plan():  # type: ignore[no-untyped-def]
    state = StateStore(REPO / ".kvpd").load(NAME)
    assert state is not None, f"no state of {NAME}"
    return state.plan


def canary_costs(repeats: int) -> None:
    p = plan()
    plain: list[float] = []
    checked: list[float] = []
    alone: list[float] = []
    for _ in range(repeats):  # alternated: both see the same machine load
        t0 = time.monotonic()
        r = canary.run(p, TransportPool(p.hosts), verify_outputs=False)
        plain.append(time.monotonic() - t0)
        t0 = time.monotonic()
        rv = canary.run(p, TransportPool(p.hosts), verify_outputs=True)
        checked.append(time.monotonic() - t0)
        alone.append(rv.outputs.get("seconds", 0.0))
        assert r.ok, (r.line, rv.line)
        assert rv.ok, (r.line, rv.line)
    med = statistics.median
    print(f"canary without the output check: median {med(plain):.3f} s ({repeats} runs)")
    print(f"canary with the output check:    median {med(checked):.3f} s; adds "
          f"{med(checked) - med(plain):.3f} s (check alone {med(alone):.3f} s, "
          f"{output_check.PROMPTS} prompts x 2 x {output_check.TOKENS} tokens)")  # fmt: skip
    deltas = [x["max_delta"] for x in rv.outputs.get("prompts", [])]
    print(f"  last: {rv.line}; largest |logprob difference| {max(deltas, default=0):.5f}")


def bench_cost() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        r = kvpd("bench", "local", *sets(), "--results", tmp, "--json", "--no-charts")
        rec = json.loads(r.stdout)["records"][0]
    phase = rec["seconds"]
    check = rec["outputs"]["seconds"]
    s = rec["result"]
    print(f"bench phase ({rec['num_prompts']} prompts, {rec['input_len']}/{rec['output_len']}, "
          f"c={rec['max_concurrency']}): vllm bench serve {phase:.2f} s wall "
          f"(benchmark duration {s.get('duration', 0):.2f} s); output check after it "
          f"{check:.3f} s = +{check / phase:.1%} of the phase")  # fmt: skip
    print(f"  {rec['outputs']['summary']}")


def faults() -> None:
    for mode in ("flip", "swap_layers", "zero_block"):
        up(f"decode.env.{FAULT}={mode}")
        pl = plan()
        r = canary.run(pl, TransportPool(pl.hosts), verify_outputs=True)
        got = r.outputs
        first = next((x for x in got.get("prompts", []) if not x["ok"]), None)
        kv = r.delta.get("summary", {}).get("decode_kv_received_tokens", 0)
        metrics_ok = not [p for p in r.problems if "outputs differ" not in p
                          and "/metrics proof passed" not in p]  # fmt: skip
        where = "-"
        if first:
            where = (f"token {first['diverged_at']} of prompt {first['index'] + 1} "
                     f"({first['pair']}: {first['detail']})")  # fmt: skip
        print(f"{FAULT}={mode}: /metrics proof {'passed' if metrics_ok else 'FAILED'} "
              f"(decode received {kv:.0f} KV tokens); {got.get('summary')}; first divergence "
              f"{where}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--faults", action="store_true", help="also run each fault injection mode")
    a = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    try:
        print(f"kvpd up local --no-canary: {up():.1f} s")
        canary_costs(a.repeats)
        bench_cost()
        if a.faults:
            faults()
    finally:
        kvpd("down", "--deployment", NAME, check=False)


if __name__ == "__main__":
    main()
