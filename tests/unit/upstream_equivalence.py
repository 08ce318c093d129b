"""Drop-in equivalence of kvpd's planner with vLLM-Ascend's own, built from the user's copy.

vLLM-Ascend's planner source (`sparse_kv_offload.cpp`) is not part of kvpd: the user fetches it
and names it with KVPD_UPSTREAM_PLANNER_CPP (as `benchmarks/ascend_planner.py --upstream-cpp`
takes it). `compile_upstream` builds it as a pybind11 module over NumPy against kvpd's stand-in
torch headers (benchmarks/upstream_stubs), natively or with a cross compiler; `compare` plans the
same decode traces with both modules, on every kvpd row planner the CPU offers and on 1 and 2
threads, and compares every output and every state after every step.

Imports only NumPy and kvpd.native (plus the standard library), so that it also runs under qemu
with the emulated arm64 Python: `python -m tests.unit.upstream_equivalence DIR` (DIR holding
upstream's module) prints one JSON line: the cases run and the mismatches.

The traces stay inside upstream's domain, where the two are meant to agree exactly: distinct
tokens per top-k row and block ids small enough for upstream's 32-bit address products (kvpd
differs on purpose beyond that; see kvpd/native/ascend_planner.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

UPSTREAM_ENV = "KVPD_UPSTREAM_PLANNER_CPP"
UPSTREAM_PATH = "vllm_ascend/distributed/kv_transfer/sparse_kv_offload/sparse_kv_offload.cpp"
# The skip when no source is given: the same words on every machine (CI cannot fetch it).
NO_SOURCE = (
    f"vLLM-Ascend's planner source is not given: fetch it and set {UPSTREAM_ENV} to it, e.g. "
    "`git clone https://github.com/vllm-project/vllm-ascend && git -C vllm-ascend checkout "
    f"182b75ea && export {UPSTREAM_ENV}=$PWD/vllm-ascend/{UPSTREAM_PATH}`"
)
MODULE = "sparse_kv_offload_upstream"
STUBS = Path(__file__).resolve().parents[2] / "benchmarks" / "upstream_stubs"
WORKERS = 8
BASES = (0x7F00_0000_0000, 0x7F80_0000_0000, 0x1_0000_0000_0000, 0x1_8000_0000_0000)


def upstream_source(environ: dict[str, str]) -> tuple[Path | None, str]:
    """The planner source the user named, or None and why (NO_SOURCE when none is named)."""
    value = environ.get(UPSTREAM_ENV, "").strip()
    if not value:
        return None, NO_SOURCE
    path = Path(value)
    if not path.is_file():
        return None, f"{UPSTREAM_ENV}={value} is not a file; {NO_SOURCE}"
    return path, ""


def compile_upstream(
    cpp: Path, out_dir: Path, compiler: str, includes: list[Path], flags: list[str], suffix: str
) -> Path:
    """Compile upstream's .cpp into `out_dir` as MODULE; returns the module file."""
    import pybind11

    out = out_dir / f"{MODULE}{suffix}"
    incs = [pybind11.get_include(), *map(str, includes), STUBS / "notorch", STUBS / "npu"]
    cmd = [compiler, "-O3", "-std=c++20", "-fopenmp", *flags, "-fPIC", "-shared"]
    cmd += [f"-I{p}" for p in incs] + [f"-DTORCH_EXTENSION_NAME={MODULE}", str(cpp), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def load_upstream(directory: Path) -> Any:
    """Import MODULE from `directory` (whatever its extension suffix)."""
    so = next(directory.glob(f"{MODULE}*.so"))
    spec = importlib.util.spec_from_file_location(MODULE, so)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class Case:
    """One layer's shape and trace; `padded` rows end in padding (-1 and past max_model_len)."""

    rows: int
    topk: int
    capacity: int
    max_model_len: int
    block: int
    steps: int
    new_requests: float
    padded: bool = False


CASES = (
    Case(8, 256, 512, 16_384, 128, 6, 1.0),
    Case(5, 128, 128, 8_192, 64, 5, 1.0),  # hot buffer no larger than top-k
    Case(12, 64, 1_024, 4_096, 16, 6, 2.0, padded=True),
)


def _trace(case: Case, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from kvpd.native.trace import synthetic_topk_trace

    t = synthetic_topk_trace(
        steps=case.steps, rows=case.rows, topk=case.topk, max_model_len=case.max_model_len,
        seq_len_range=(case.topk * 2, case.max_model_len), overlap=0.8,
        new_requests_per_step=case.new_requests, seed=seed,
    )  # fmt: skip
    topk = t.topk_indices.copy()
    if case.padded:  # a quarter of each odd row's positions: -1, and one past max_model_len
        q = case.topk // 4
        topk[:, 1::2, -q:] = -1
        topk[:, 1::2, -1] = case.max_model_len
    return topk, t.req_ids, t.stable_prefix_lens


class Layer:
    """One layer's state and the manager's buffers, in upstream's layout."""

    def __init__(self, case: Case) -> None:
        r, k, c, m = case.rows, case.topk, case.capacity, case.max_model_len
        self.case = case
        self.last = np.full(r, -1, np.int64)
        self.stt = np.full((r, c), -1, np.int32)
        self.lru = np.tile(np.arange(c, dtype=np.int32), (r, 1))
        self.cur, self.mt, self.ms = (np.empty((r, k), np.int32) for _ in range(3))
        self.mc = np.empty(r, np.int32)
        self.ws = [
            np.zeros((WORKERS, m), np.int32), np.full((WORKERS, m), -1, np.int32),
            np.empty((WORKERS, 3 * c), np.int32), np.empty((WORKERS, k), np.int32),
            np.zeros(WORKERS, np.int32),
        ]  # fmt: skip
        self.gvas, self.addr = np.zeros(2 * r * k, np.int64), np.zeros(2 * r * k, np.int64)
        self.size, self.num = np.zeros(2 * r * k, np.int32), np.zeros(1, np.int32)

    def step(self, mod: Any, ins: tuple[np.ndarray, ...], bt: np.ndarray, threads: int) -> str:
        """Plan one step with `mod`; returns the digest of every output and the state after."""
        c = self.case
        topk, req, stable = (np.ascontiguousarray(a) for a in ins)
        ptrs = [a.ctypes.data for a in (req, self.last, topk, stable, self.stt, self.lru)]
        ptrs += [a.ctypes.data for a in (self.cur, self.mc, self.mt, self.ms, *self.ws)]
        mod.lru_resident_compact(*ptrs, c.rows, c.topk, c.capacity, c.max_model_len, WORKERS,
                                 threads)  # fmt: skip
        s = mod.compute_lru_resident_addrs(
            self.mc, self.mt, self.ms, bt, c.block, 512 * 2, 64 * 2, *BASES, c.capacity, threads,
            self.gvas, self.addr, self.size, self.num,
        )  # fmt: skip
        h = hashlib.sha256()
        outs = (self.cur, self.mc, self.mt, self.ms, self.stt, self.lru, self.last,
                self.gvas[: 2 * s], self.addr[: 2 * s], self.size[: 2 * s], self.num)  # fmt: skip
        for a in outs:
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()


def _run(mod: Any, case: Case, seed: int, threads: int) -> list[str]:
    topk, req, stable = _trace(case, seed)
    blocks = (case.rows, case.max_model_len // case.block)
    bt = np.random.default_rng(seed).integers(0, 4_096, blocks)
    layer = Layer(case)
    return [layer.step(mod, (topk[i], req[i], stable[i]), bt.astype(np.int32), threads)
            for i in range(case.steps)]  # fmt: skip


def compare(upstream: Any) -> dict[str, Any]:
    """Every case, on every kvpd row planner the CPU has and on 1 and 2 threads, against
    upstream on the same thread count: {"cases": n, "isas": [...], "mismatches": [...]}."""
    from kvpd.native import ascend_planner as kvpd_mod

    isas = list(kvpd_mod.isa_info()["available"])
    chosen = kvpd_mod.isa_info()["isa"]
    runs, mismatches = 0, []
    try:
        for n, case in enumerate(CASES):
            for threads in (1, 2):
                want = _run(upstream, case, n, threads)
                for isa in isas:
                    assert kvpd_mod.set_isa(isa)
                    got = _run(kvpd_mod, case, n, threads)
                    runs += 1
                    bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
                    if bad:
                        mismatches.append(f"{case} threads={threads} {isa}: steps {bad}")
    finally:
        kvpd_mod.set_isa(chosen)
    return {"runs": runs, "isas": isas, "chosen": chosen, "mismatches": mismatches}


if __name__ == "__main__":
    print(json.dumps(compare(load_upstream(Path(sys.argv[1])))))
