"""Decode-scale timing of the sparse-KV planner: native (1 and 2 threads) vs vectorised NumPy.

Shape: 64 rows, top-k 2048, hot buffer 4096 slots, max_model_len 131072, block size
128, sequence lengths 20k-131k, 80% of top-k tokens kept between steps, new requests on two rows
per step; MLA token bytes K=512*2, V=64*2. Prints the median time of one layer's plan() plus
build_copy_descriptors(), and of a full 61-layer step. The machine may be shared: every number
is a median over repeated calls.

    .venv/bin/python benchmarks/native_planner.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# NumPy's OpenBLAS threads spin after start-up and steal the second core from OpenMP.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from kvpd.native import fallback
from kvpd.native.trace import synthetic_topk_trace

try:
    from kvpd.native import _sparse_lru as native
except ImportError:
    native = None

ROWS, TOPK, CAPACITY, MML, BLOCK = 64, 2048, 4096, 131_072, 128
TOK_K, TOK_V = 512 * 2, 64 * 2
BASES = (0x7F00_0000_0000, 0x7F80_0000_0000, 0x1_0000_0000_0000, 0x1_8000_0000_0000)


def block_table(rng: np.random.Generator) -> np.ndarray:
    # Block ids far past 16384 so 32-bit address products would overflow.
    ids = rng.permutation(ROWS * (MML // BLOCK)) + 20_000
    return ids.reshape(ROWS, MML // BLOCK).astype(np.int32)


def layer_times(mod, planner, trace, bt, warm: int) -> tuple[list[float], list[float]]:
    """Times (plan, descriptors) in ms for each step after `warm` untimed ones."""
    plan_ms, desc_ms = [], []
    for step in range(trace.steps):
        args = (trace.topk_indices[step], trace.req_ids[step], trace.stable_prefix_lens[step])
        t0 = time.perf_counter()
        _, mt, ms, mc = planner.plan(0, *args)
        t1 = time.perf_counter()
        mod.build_copy_descriptors(
            mt, ms, mc, bt, BLOCK, *BASES, TOK_K, TOK_V, CAPACITY, num_threads=planner.num_threads
        )
        t2 = time.perf_counter()
        if step >= warm:
            plan_ms.append((t1 - t0) * 1e3)
            desc_ms.append((t2 - t1) * 1e3)
    return plan_ms, desc_ms


def full_step_ms(planner, trace, bt, layers: int, warm: int) -> list[float]:
    out = []
    for step in range(trace.steps):
        args = (trace.topk_indices[step], trace.req_ids[step], trace.stable_prefix_lens[step])
        t0 = time.perf_counter()
        for layer in range(layers):
            _, mt, ms, mc = planner.plan(layer, *args)
            native.build_copy_descriptors(
                mt,
                ms,
                mc,
                bt,
                BLOCK,
                *BASES,
                TOK_K,
                TOK_V,
                CAPACITY,
                num_threads=planner.num_threads,
            )
        if step >= warm:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    warm, timed = (3, 4) if a.quick else (4, 12)
    repeats = 2 if a.quick else a.repeats
    rng = np.random.default_rng(0)
    trace = synthetic_topk_trace(
        steps=warm + timed,
        rows=ROWS,
        topk=TOPK,
        max_model_len=MML,
        overlap=0.8,
        new_requests_per_step=2,
        seed=1,
    )
    bt = block_table(rng)
    misses = None
    print(
        f"shape: rows={ROWS} topk={TOPK} capacity={CAPACITY} max_model_len={MML} "
        f"block={BLOCK}; {timed} timed steps x {repeats} repeats, median"
    )
    results = {}
    configs = [("numpy", fallback, 1)]
    if native is not None:
        configs = [("native 1 thread", native, 1), ("native 2 threads", native, 2), *configs]
    for name, mod, threads in configs:
        plan_ms, desc_ms = [], []
        for _ in range(min(2, repeats) if mod is fallback else repeats):
            p = mod.SparseLRUPlanner(1, ROWS, TOPK, CAPACITY, MML, num_threads=threads)
            pm, dm = layer_times(mod, p, trace, bt, warm)
            plan_ms += pm
            desc_ms += dm
        if misses is None:
            p = fallback.SparseLRUPlanner(1, ROWS, TOPK, CAPACITY, MML)
            counts = [
                p.plan(0, trace.topk_indices[s], trace.req_ids[s], trace.stable_prefix_lens[s])[
                    3
                ].sum()
                for s in range(trace.steps)
            ]
            misses = statistics.median(counts[warm:])
            print(
                f"median misses per layer call: {misses:.0f} of {ROWS * TOPK} "
                f"({misses / (ROWS * TOPK):.1%})"
            )
        total = [x + y for x, y in zip(plan_ms, desc_ms, strict=True)]
        results[name] = statistics.median(total)
        print(
            f"{name:>17}: plan {statistics.median(plan_ms):7.3f} ms + descriptors "
            f"{statistics.median(desc_ms):6.3f} ms = {results[name]:7.3f} ms per layer "
            f"(min {min(total):.3f})"
        )
    if native is not None:
        for name in ("native 1 thread", "native 2 threads"):
            print(f"numpy / {name}: {results['numpy'] / results[name]:.1f}x")
        for threads in (1, 2):
            p = native.SparseLRUPlanner(a.layers, ROWS, TOPK, CAPACITY, MML, num_threads=threads)
            steps = full_step_ms(p, trace, bt, a.layers, warm)
            print(
                f"full step, {a.layers} layers, native {threads} thread(s): "
                f"{statistics.median(steps):.2f} ms ({statistics.median(steps) / a.layers:.3f}"
                f" ms per layer; min {min(steps):.2f} ms)"
            )


if __name__ == "__main__":
    main()
