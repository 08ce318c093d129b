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

    .venv/bin/python benchmarks/ascend_planner_phases.py [--rounds 5]

x86-64 only (it reads the time-stamp counter).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from kvpd.native.trace import synthetic_topk_trace

ROWS, TOPK, CAP, MML, STEPS = 64, 2048, 4096, 131_072, 15
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


if __name__ == "__main__":
    main()
