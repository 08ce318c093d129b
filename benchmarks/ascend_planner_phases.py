"""Where the portable row planner's time goes, per phase, and what the memory and branches cost.

Compiles benchmarks/ascend_planner_phases.cpp (kvpd's shared row phases, the baseline path's
-march=x86-64-v2, and the AVX2 path's instruction set) in a few variants and runs them on the
shape of benchmarks/ascend_planner.py (64 rows, top-k 2048, 4096 slots, 128k tokens; one thread,
the layer's rows one after another). Each variant runs several times, interleaved with the
others; the figures are minima (the machine is shared). Prints per layer (ms) and per row
(time-stamp-counter ticks) for each phase:

- `phases`: the instrumented build;
- `state in L2`: the same with only 8 rows, so that every row's state stays in L2 (what the
  state's traffic from L3 costs; the layer figure is scaled to 64 rows);
- `no prefetch`: without fetching the next row's state ahead;
- `branchy resolve`: every row resolved with a branch on each miss (what a mispredicted miss
  costs).

Then what bounds a whole layer at 1 and 2 threads, through kvpd's module as the manager calls
it (the load-time row planner): the plan step (`lru_resident_compact`), the descriptor pass
(`compute_lru_resident_addrs`) and, within it, its fixed cost (the same call with no misses:
argument checks, the hand-over to the helper, the prefix sum), median and minimum per layer over
`--rounds` x 12 layers. The plan step is split further by the phase shares of the matching
instrumented build above (1 thread; on 2 threads each row runs the same phases on its thread),
so the last table reads as "descriptor pass x%, LRU walk y%, resolve z%" of a layer.

    .venv/bin/python benchmarks/ascend_planner_phases.py [--rounds 5]

x86-64 only (it reads the time-stamp counter).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from kvpd.native import ascend_planner as kvpd_mod
from kvpd.native.trace import synthetic_topk_trace

ROWS, TOPK, CAP, MML, STEPS = 64, 2048, 4096, 131_072, 15
# benchmarks/ascend_planner.py's layer: block 128, MLA token bytes, 8 workspaces, bases.
BLOCK, TOK_K, TOK_V, WORKERS = 128, 512 * 2, 64 * 2, 8
BASES = (0x7F00_0000_0000, 0x7F80_0000_0000, 0x1_0000_0000_0000, 0x1_8000_0000_0000)
# Row phases (names printed by ascend_planner_phases.cpp) grouped for the layer table.
GROUPS = {
    "LRU walk": ("walk: slot-order drop/check", "walk: LRU-order split", "walk: ranks of hits"),
    "resolve": ("resolve positions + misses",),
    "mark + rank suffix": ("mark top-k bitmap", "rank suffix"),
    "finish lists": ("finish lists",),
}
SRC = Path(__file__).resolve().parent / "ascend_planner_phases.cpp"
ISAS = {
    "baseline": ["-march=x86-64-v2"],
    "avx2": ["-march=x86-64-v2", "-mavx2", "-mbmi", "-mbmi2", "-mlzcnt", "-mfma"],
}
VARIANTS = {
    "plain": [],
    "phases": ["-DKVPD_PHASES"],
    "state in L2 (8 rows)": ["-DKVPD_PHASES", "-DROWS_RESIDENT=8"],
    "no prefetch": ["-DKVPD_PHASES", "-DNO_PREFETCH"],
    "branchy resolve": ["-DKVPD_PHASES", "-DBRANCHY_RESOLVE"],
}


def write_trace(out: Path) -> None:
    trace = synthetic_topk_trace(steps=STEPS, rows=ROWS, topk=TOPK, max_model_len=MML,
                                 overlap=0.8, new_requests_per_step=2, seed=1)  # fmt: skip
    trace.topk_indices.astype(np.int32).tofile(out / "topk.bin")
    trace.req_ids.astype(np.int64).tofile(out / "req.bin")
    trace.stable_prefix_lens.astype(np.int32).tofile(out / "stable.bin")


def build(out: Path, isa: str, variant: str) -> Path:
    exe = out / f"{isa}-{variant.split()[0]}-{abs(hash(variant)) % 10_000}"
    cxx = os.environ.get("CXX", "g++")
    cmd = [cxx, "-O3", "-std=c++17", *ISAS[isa], *VARIANTS[variant], str(SRC), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def run(exe: Path, out: Path) -> tuple[float, dict[str, float]]:
    args = [str(exe), str(out), str(STEPS), str(ROWS), str(TOPK), str(CAP), str(MML), "10"]
    done = subprocess.run(args, check=True, capture_output=True, text=True)
    layer, phases = 0.0, {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "layer_ms":
            layer = float(value)
        elif key == "phase":
            name, _, ticks = value.partition("|")
            phases[name] = float(ticks)
    return layer, phases


class CallLayer:
    """One layer's state and the manager's buffers (upstream's layout), planned through kvpd's
    module: per step, the plan step, the descriptor pass, and the descriptor call with no
    misses, each timed on its own (microseconds)."""

    def __init__(self, bt: np.ndarray) -> None:
        self.bt = bt
        self.last = np.full(ROWS, -1, np.int64)
        self.stt = np.full((ROWS, CAP), -1, np.int32)
        self.lru = np.tile(np.arange(CAP, dtype=np.int32), (ROWS, 1))
        self.cur, self.mt, self.ms = (np.empty((ROWS, TOPK), np.int32) for _ in range(3))
        self.mc, self.no_miss = np.empty(ROWS, np.int32), np.zeros(ROWS, np.int32)
        self.ws = [np.zeros((WORKERS, MML), np.int32), np.full((WORKERS, MML), -1, np.int32),
                   np.empty((WORKERS, 3 * CAP), np.int32), np.empty((WORKERS, TOPK), np.int32),
                   np.zeros(WORKERS, np.int32)]  # fmt: skip
        n = 2 * ROWS * TOPK
        self.gvas, self.addr = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.size, self.num = np.zeros(n, np.int32), np.zeros(1, np.int32)

    def descriptors(self, miss_count: np.ndarray, threads: int) -> float:
        t0 = time.perf_counter()
        kvpd_mod.compute_lru_resident_addrs(
            miss_count, self.mt, self.ms, self.bt, BLOCK, TOK_K, TOK_V, *BASES, CAP, threads,
            self.gvas, self.addr, self.size, self.num,
        )  # fmt: skip
        return (time.perf_counter() - t0) * 1e6

    def step(self, topk, req, stable, threads: int) -> tuple[float, float, float]:
        ptrs = [a.ctypes.data for a in (req, self.last, topk, stable, self.stt, self.lru)]
        ptrs += [a.ctypes.data for a in (self.cur, self.mc, self.mt, self.ms, *self.ws)]
        t0 = time.perf_counter()
        kvpd_mod.lru_resident_compact(*ptrs, ROWS, TOPK, CAP, MML, WORKERS, threads)
        plan = (time.perf_counter() - t0) * 1e6
        return plan, self.descriptors(self.mc, threads), self.descriptors(self.no_miss, threads)


def call_split(rounds: int) -> dict[int, list[tuple[float, float, float]]]:
    """(plan, descriptors, fixed cost) per layer in microseconds, per thread count; the thread
    counts take turns per round so that load drift spreads."""
    trace = synthetic_topk_trace(steps=STEPS, rows=ROWS, topk=TOPK, max_model_len=MML,
                                 overlap=0.8, new_requests_per_step=2, seed=1)  # fmt: skip
    bt = np.random.default_rng(0).integers(0, 16_384, (ROWS, MML // BLOCK)).astype(np.int32)
    out: dict[int, list[tuple[float, float, float]]] = {1: [], 2: []}
    for _ in range(rounds):
        for threads in out:
            layer = CallLayer(bt)
            for step in range(trace.steps):
                ins = (trace.topk_indices[step], trace.req_ids[step])
                t = layer.step(*ins, trace.stable_prefix_lens[step], threads)
                if step >= 3:
                    out[threads].append(t)
    return out


def print_split(split, shares: dict[str, float], isa: str) -> None:
    """The layer's parts per thread count, and the plan step split by the row phase shares."""
    print(f"\nkvpd's module ({isa} row planner), per layer, us: median (min); "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    medians = {}
    for threads, samples in split.items():
        plan, desc, fixed = (statistics.median(c) for c in zip(*samples, strict=True))
        lows = [min(c) for c in zip(*samples, strict=True)]
        medians[threads] = (plan, desc, fixed)
        print(f"  {threads} thread(s): plan step {plan:6.0f} ({lows[0]:.0f}), descriptor pass "
              f"{desc:5.0f} ({lows[1]:.0f}) of which fixed cost {fixed:4.1f} ({lows[2]:.1f}); "
              f"layer {plan + desc:6.0f}")  # fmt: skip
    p1, d1, _ = medians[1]
    p2, d2, _ = medians[2]
    print(f"  1 -> 2 threads: plan step {p1 / p2:.2f}x, descriptor pass {d1 / d2:.2f}x, "
          f"layer {(p1 + d1) / (p2 + d2):.2f}x")  # fmt: skip
    print("  share of the layer (medians; the plan step split by the row phase shares):")
    for threads, (plan, desc, fixed) in medians.items():
        layer = plan + desc
        parts = [f"descriptor pass {desc / layer:4.0%} (fixed cost {fixed / layer:.0%})"]
        parts += [f"{name} {plan * share / layer:4.0%}" for name, share in shares.items()]
        print(f"  {threads} thread(s): " + ", ".join(parts))


def row_shares(phases: dict[str, float]) -> dict[str, float]:
    total = sum(phases.values()) or 1.0
    return {g: sum(phases.get(n, 0.0) for n in names) / total for g, names in GROUPS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        print("x86-64 only (it reads the time-stamp counter)")
        return
    with tempfile.TemporaryDirectory(prefix="kvpd-phases-") as tmp:
        out = Path(tmp)
        write_trace(out)
        exes = {(i, v): build(out, i, v) for i in ISAS for v in VARIANTS}
        best: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}
        for _ in range(a.rounds):
            for key, exe in exes.items():
                layer, phases = run(exe, out)
                old = best.get(key)
                merged = {n: min(t, old[1].get(n, t)) if old else t for n, t in phases.items()}
                best[key] = (min(layer, old[0]) if old else layer, merged)
        for isa in ISAS:
            print(f"\n{isa} ({' '.join(ISAS[isa])}): min ms per layer, ticks per row")
            for variant in VARIANTS:
                layer, phases = best[(isa, variant)]
                if "ROWS_RESIDENT=8" in " ".join(VARIANTS[variant]):
                    layer *= ROWS / 8  # as if 64 rows cost what these 8 did
                total = sum(phases.values())
                note = f"  ({total:.0f} ticks per row)" if total else ""
                print(f"  {variant:>22}: {layer:.3f} ms{note}")
                for name, tick in phases.items():
                    print(f"  {'':>22}   {name:<28} {tick:7.0f}")
    isa = kvpd_mod.isa_info()["isa"]
    shares = row_shares(best[("avx2" if isa == "avx2" else "baseline", "phases")][1])
    print_split(call_split(a.rounds), shares, isa)


if __name__ == "__main__":
    main()
