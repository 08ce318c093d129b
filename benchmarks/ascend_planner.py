"""kvpd's planner through vLLM-Ascend's interface vs vLLM-Ascend's own planner, side by side.

Shape: 64 rows, top-k 2048, hot buffer 4096 slots, max_model_len 131072, block 128,
MLA token bytes K=512*2, V=64*2, 80% of top-k kept between steps, two new requests per step.
One "layer" is lru_resident_compact + compute_lru_resident_addrs with the manager's buffers
(8 workspaces; requested threads 1 or 2). Each implementation plans the same trace back to back
(as a decode process plans layer after layer), the implementations take turns per repeat, every
output and the state after every step are compared by digest, and the median, minimum and mean
per layer are printed. On a shared machine the minimum is the steadiest; a decode step pays the
sum of its layers, so a rare layer that waits a scheduler slice counts in full in the mean, where
the median ignores it. Last, the plan call's excess at 2 threads over half its 1-thread time,
split from kvpd's pool record of each shared call: the helper's start, the caller's wait for its
last row, the caller's rows running slower than alone, and the rest.

Upstream's planner is not part of kvpd: fetch `sparse_kv_offload.cpp` yourself (vllm-project/
vllm-ascend, vllm_ascend/distributed/kv_transfer/sparse_kv_offload/, base commit 182b75ea) and
pass it with --upstream-cpp (or KVPD_UPSTREAM_PLANNER_CPP). It is compiled here with -O3
-march=native against kvpd's stand-in headers (benchmarks/upstream_stubs). Without it, only
kvpd's rows are printed.

--held-core runs the comparison a second time while a process spins on every CPU but the first:
a stand-in for what shares a decode host's cores with the planner (the engine's own threads, the
runtime's), so that the second thread has no core of its own. vLLM-Ascend's OpenMP thread spins
there between calls and its barrier waits for it; kvpd's helper, woken on the caller's CPU, leaves
the layer to the caller. Each implementation's turns print how much of their CPUs the spinning
processes kept meanwhile, and the mean per layer shows the layers that waited a scheduler slice.
Each spinning process ends itself after at most --held-core-limit seconds and is killed when the
run ends.

--jit-python PY (a Python with torch and ninja, e.g. the engine venv's) also measures what a
decode start pays today: torch.utils.cpp_extension.load of upstream's .cpp with its flags (cold,
TORCH_EXTENSIONS_ALWAYS_BUILD=1 as the manager sets) against importing kvpd's prebuilt module;
then the descriptor call's fixed cost with CPU torch tensors, as the manager passes them, for
the module it built and for kvpd's.

    .venv/bin/python benchmarks/ascend_planner.py --upstream-cpp /path/to/sparse_kv_offload.cpp \
        [--jit-python .venv-engine/bin/python] [--held-core] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # OpenBLAS spinners steal the second core

import numpy as np

from kvpd.native import ascend_planner as kvpd_mod
from kvpd.native.trace import synthetic_topk_trace
from kvpd.testing.termination import stop_on_termination

ROWS, TOPK, CAP, MML, BLOCK = 64, 2048, 4096, 131_072, 128
TOK_K, TOK_V, WORKERS = 512 * 2, 64 * 2, 8
BASES = (0x7F00_0000_0000, 0x7F80_0000_0000, 0x1_0000_0000_0000, 0x1_8000_0000_0000)
STUBS = Path(__file__).resolve().parent / "upstream_stubs"


def build_upstream(cpp: Path) -> object:
    """Compile upstream's .cpp as a pybind11 module over NumPy (cached by source digest)."""
    import pybind11

    digest = hashlib.sha256(cpp.read_bytes()).hexdigest()[:16]
    out_dir = Path(tempfile.gettempdir()) / f"kvpd-bench-upstream-{digest}"
    out_dir.mkdir(exist_ok=True)
    name = "sparse_kv_offload_upstream"
    so = out_dir / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not so.exists():
        cmd = [
            os.environ.get("CXX", "g++"), "-O3", "-std=c++20", "-fopenmp", "-march=native",
            "-fPIC", "-shared", f"-I{pybind11.get_include()}",
            f"-I{sysconfig.get_paths()['include']}", f"-I{STUBS / 'notorch'}",
            f"-I{STUBS / 'npu'}", f"-DTORCH_EXTENSION_NAME={name}", str(cpp), "-o", str(so),
        ]  # fmt: skip
        subprocess.run(cmd, check=True)
    spec = importlib.util.spec_from_file_location(name, so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Layer:
    """One layer's state and the manager's shared buffers, in upstream's layout."""

    def __init__(self) -> None:
        self.last = np.full(ROWS, -1, np.int64)
        self.stt = np.full((ROWS, CAP), -1, np.int32)
        self.lru = np.tile(np.arange(CAP, dtype=np.int32), (ROWS, 1))
        self.cur = np.empty((ROWS, TOPK), np.int32)
        self.mc = np.empty(ROWS, np.int32)
        self.mt = np.empty((ROWS, TOPK), np.int32)
        self.ms = np.empty((ROWS, TOPK), np.int32)
        self.ws = [
            np.zeros((WORKERS, MML), np.int32),
            np.full((WORKERS, MML), -1, np.int32),
            np.empty((WORKERS, 3 * CAP), np.int32),
            np.empty((WORKERS, TOPK), np.int32),
            np.zeros(WORKERS, np.int32),
        ]
        n = 2 * ROWS * TOPK
        self.gvas, self.addr = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.size, self.num = np.zeros(n, np.int32), np.zeros(1, np.int32)

    def step(self, mod, topk, req, stable, bt, threads: int) -> float:
        ptrs = [a.ctypes.data for a in (req, self.last, topk, stable, self.stt, self.lru)]
        ptrs += [a.ctypes.data for a in (self.cur, self.mc, self.mt, self.ms, *self.ws)]
        t0 = time.perf_counter()
        mod.lru_resident_compact(*ptrs, ROWS, TOPK, CAP, MML, WORKERS, threads)
        self.plan_ms = (time.perf_counter() - t0) * 1e3
        s = mod.compute_lru_resident_addrs(
            self.mc, self.mt, self.ms, bt, BLOCK, TOK_K, TOK_V, *BASES, CAP, threads,
            self.gvas, self.addr, self.size, self.num,
        )  # fmt: skip
        dt = time.perf_counter() - t0
        self.s = s
        return dt * 1e3

    def outputs(self) -> list[np.ndarray]:
        n = 2 * self.s
        return [self.cur, self.mc, self.mt, self.ms, self.stt, self.lru, self.last,
                self.gvas[:n], self.addr[:n], self.size[:n], self.num]  # fmt: skip

    def digest(self) -> bytes:
        """Every output and the state after a step, for comparing implementations."""
        h = hashlib.sha256()
        for a in self.outputs():
            h.update(np.ascontiguousarray(a).tobytes())
        return h.digest()


def busy_jiffies() -> tuple[int, int]:
    """(CPU time of every process, of this one), in clock ticks: what others took in between
    two readings is the difference of the differences."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])


def cpu_ns(pids: list[int]) -> int:
    """CPU time the processes have run, in nanoseconds (the scheduler's own count)."""
    return sum(int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) for pid in pids)


class Block:
    """One thread count's samples per implementation: layer and plan-call times (ms), first-repeat
    digests, kvpd's shared calls as its pool recorded them (kvpd.native.pool_calls), and, with a
    held core, the spinning processes' CPU time and the wall time of the implementation's turns
    (times the number of held CPUs)."""

    def __init__(self, configs) -> None:
        names = [name for name, _, _ in configs]
        self.times: dict[str, list[float]] = {name: [] for name in names}
        self.plan: dict[str, list[float]] = {name: [] for name in names}
        self.digests: dict[str, list[bytes]] = {name: [] for name in names}
        self.calls: dict[str, list[dict]] = {name: [] for name in names}
        self.held: dict[str, list[int]] = {name: [0, 0] for name in names}


def run_turn(block: Block, config, threads: int, trace, bt, first: bool, spinners: list[int]):
    """One implementation plans the whole trace back to back on `threads` threads, as a decode
    process plans layer after layer (so OpenMP's spinning helpers after upstream's call hit
    upstream's next call, not kvpd's)."""
    warm = 3
    name, mod, isa = config
    if isa is not None:
        kvpd_mod.set_isa(isa)
    layer = Layer()
    turn = (cpu_ns(spinners), time.monotonic_ns())
    for step in range(trace.steps):
        if step == warm and isa is not None:
            kvpd_mod.pool_calls()  # the warm-up steps' calls are not kept
        ins = (trace.topk_indices[step], trace.req_ids[step])
        dt = layer.step(mod, *ins, trace.stable_prefix_lens[step], bt, threads)
        if step >= warm:
            block.times[name].append(dt)
            block.plan[name].append(layer.plan_ms)
        if first:
            block.digests[name].append(layer.digest())
    if spinners:
        block.held[name][0] += cpu_ns(spinners) - turn[0]
        block.held[name][1] += (time.monotonic_ns() - turn[1]) * len(spinners)
    if isa is not None:
        block.calls[name] += kvpd_mod.pool_calls()


def run_blocks(args, trace, bt, configs, spinners: list[int]):
    """Every implementation on 1 and on 2 threads: a Block per thread count, and the share of
    the CPUs other processes used meanwhile. The thread counts take turns within each
    implementation's turn, so that the host's slow spells (another tenant on a vCPU's core, for
    minutes at a time) fall on both and the 1 -> 2 threads ratios compare like with like; the
    implementations' order rotates per repeat so that load drift spreads. `spinners`: the PIDs
    of the processes holding cores, whose CPU time is counted per implementation's turns."""
    blocks = {1: Block(configs), 2: Block(configs)}
    (all0, own0), t0 = busy_jiffies(), time.monotonic()
    for rep in range(args.repeats):
        order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
        for config in order:
            for threads in (1, 2) if rep % 2 == 0 else (2, 1):
                run_turn(blocks[threads], config, threads, trace, bt, rep == 0, spinners)
    (all1, own1), wall = busy_jiffies(), time.monotonic() - t0
    hz, cpus = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    others = ((all1 - all0) - (own1 - own0)) / (hz * wall * cpus)
    return blocks, max(others, 0.0)


def print_two_thread_costs(one: Block, two: Block, upstream_name: str | None) -> None:
    """Where kvpd's plan call at 2 threads spends more than half its 1-thread time, from the
    calls its pool recorded (medians): the helper's start after the call, the caller's wait for
    the helper's last row once its own were done, and the caller's rows taking longer than they
    do alone (the 1-thread row: the 1-thread plan call over its rows). The same excess for
    upstream's planner, whose OpenMP team records nothing."""
    med = statistics.median
    print("\nplan call at 2 threads beyond half the 1-thread call (medians, us):")
    for name, calls in two.calls.items():
        plans = [c for c in calls if c["chunk"] == 1 and c["caller_rows"] > 0]
        if not plans:  # upstream's planner, or no call shared
            continue
        plan1 = med(one.plan[name]) * 1e3
        row1 = plan1 / ROWS
        row2 = med(c["caller_ns"] / c["caller_rows"] for c in plans) / 1e3
        joins = [c["join_ns"] for c in plans if c["join_ns"] >= 0]
        join = med(joins) / 1e3 if joins else float("nan")
        wait = med(c["wait_ns"] for c in plans) / 1e3
        rows = med(c["caller_rows"] for c in plans)
        excess = med(two.plan[name]) * 1e3 - plan1 / 2
        slower = rows * (row2 - row1)
        rest = excess - join - wait - slower
        print(f"  {name:>34}: {excess:5.1f} = helper started {join:.1f} after the call + caller "
              f"waited {wait:.1f} for the helper's last row + caller's {rows:.0f} rows took "
              f"{slower:.1f} more ({row2:.2f} each against {row1:.2f} alone, "
              f"{(row2 / row1 - 1) * 100:+.1f}%) + {rest:.1f} else (the call itself, calls "
              f"planned alone); {len(plans)} calls")  # fmt: skip
    if upstream_name is not None:
        excess = med(two.plan[upstream_name]) * 1e3 - med(one.plan[upstream_name]) * 1e3 / 2
        print(f"  {upstream_name:>34}: {excess:5.1f} (its OpenMP team records no split)")


def print_block(threads: int, block: Block, others: float, upstream_name: str | None) -> None:
    times, digests = block.times, block.digests
    names = list(times)
    identical = all(d == digests[names[0]] for d in digests.values())
    print(f"\n{threads} thread(s): median ms per layer (plan + descriptors), "
          f"{len(times[names[0]])} samples; other processes used {others:.0%} of the "
          f"{os.cpu_count()} CPUs meanwhile (load {os.getloadavg()[0]:.2f})")  # fmt: skip
    for name, t in times.items():
        print(f"  {name:>34}: {statistics.median(t):7.3f} ms  (min {min(t):.3f}, "
              f"mean {statistics.fmean(t):.3f})")  # fmt: skip
    if upstream_name is not None:
        up = times[upstream_name]
        for name in names[:-1]:
            t = times[name]
            ratio = statistics.median(up) / statistics.median(t)
            print(f"  {'speed-up ' + name:>34}: {ratio:.2f}x (median), "
                  f"{min(up) / min(t):.2f}x (min), "
                  f"{statistics.fmean(up) / statistics.fmean(t):.2f}x (mean)")  # fmt: skip
    steps = len(digests[names[0]])
    print(f"  outputs identical across all rows above: {identical} "
          f"({steps} steps x {len(names)} implementations, every output and state)")  # fmt: skip


def print_held(block: Block) -> None:
    """How much of their CPUs the spinning processes kept during each implementation's turns."""
    for name, (spun, wall) in block.held.items():
        print(f"  {'held cores, ' + name:>34}: the spinning processes ran "
              f"{spun / max(wall, 1):.0%} of the time")  # fmt: skip


def compare(args, trace, bt, upstream, isas: list[str], spinners: list[int]) -> None:
    configs = [(f"kvpd {isa}", kvpd_mod, isa) for isa in isas]
    upstream_name = None
    if upstream is not None:
        upstream_name = "vLLM-Ascend (-O3 -march=native)"
        configs.append((upstream_name, upstream, None))
    before = kvpd_mod.pool_stats()
    per_threads, others = run_blocks(args, trace, bt, configs, spinners)
    after = kvpd_mod.pool_stats()
    kvpd_mod.set_isa(isas[0])
    for threads, block in per_threads.items():
        print_block(threads, block, others, upstream_name)
        if spinners:
            print_held(block)
    # a stall: the caller waited for a helper it took to be preempted
    jobs, stalls, solo, same = (
        after[k] - before[k] for k in ("jobs", "stalls", "solo", "same_cpu")
    )
    print(f"  kvpd's threads: {jobs} calls shared with the helper, {stalls} stalled by it, "
          f"{solo} planned alone after a stall, {same} left by a helper woken on the caller's "
          "CPU")  # fmt: skip
    print("\n1 -> 2 threads (time at 1 / time at 2):")
    for name, _, _ in configs:
        one, two = per_threads[1].times[name], per_threads[2].times[name]
        print(f"  {name:>34}: {statistics.median(one) / statistics.median(two):.2f}x (median), "
              f"{min(one) / min(two):.2f}x (min), "
              f"{statistics.fmean(one) / statistics.fmean(two):.2f}x (mean)")  # fmt: skip
    print_two_thread_costs(per_threads[1], per_threads[2], upstream_name)


# A held core's process: spins on one CPU until its time limit (it never outlives a run that is
# killed without cleanup by more than that).
SPINNER = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    pass
"""


@contextlib.contextmanager
def cores_held(cpus: list[int], limit_s: float):
    """A process spinning on each of `cpus` for the comparison's duration (a stand-in for the
    engine's threads on a decode host's cores); each killed by its own PID on the way out."""
    procs: list[subprocess.Popen] = []
    try:
        for cpu in cpus:
            procs.append(subprocess.Popen([sys.executable, "-c", SPINNER, str(cpu), str(limit_s)]))
        time.sleep(0.2)  # running and pinned before the first sample
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def jit_vs_import(jit_python: str, cpp: Path | None) -> None:
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    imp = subprocess.run(
        [jit_python, "-c", "import time; t = time.perf_counter(); "
         "import kvpd.native.ascend_planner; print(time.perf_counter() - t)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    print(f"\nimport kvpd.native.ascend_planner ({jit_python}): {float(imp.stdout) * 1e3:.1f} ms")
    if cpp is None:
        print("JIT compile of upstream's planner: skipped (no --upstream-cpp)")
        return
    build = Path(tempfile.mkdtemp(prefix="kvpd-bench-jit-"))
    code = (
        "import time, torch.utils.cpp_extension as ce, sys; t = time.perf_counter(); "
        "up = ce.load(name='sparse_kv_offload', sources=[sys.argv[1]], "
        "build_directory=sys.argv[2], extra_cflags=['-O3', '-std=c++20', '-fopenmp', "
        f"'-march=native', '-fPIC', '-I{STUBS / 'npu'}'], extra_ldflags=['-fopenmp']); "
        "print(time.perf_counter() - t)\n" + TORCH_CALL_COST
    )
    try:
        jit = subprocess.run(
            [jit_python, "-c", code, str(cpp), str(build)],
            env={**env, "TORCH_EXTENSIONS_ALWAYS_BUILD": "1"}, capture_output=True, text=True,
        )  # fmt: skip
    finally:
        shutil.rmtree(build, ignore_errors=True)
    if jit.returncode != 0:
        print(f"JIT compile of upstream's planner failed:\n{jit.stderr[-2000:]}")
        return
    secs, kvpd_us, up_us = (float(x) for x in jit.stdout.split()[-3:])
    print(f"torch cpp_extension.load of upstream's planner (cold build): {secs:.1f} s")
    print(f"descriptor call with the manager's CPU torch tensors and no misses (its fixed cost), "
          f"median: kvpd {kvpd_us:.2f} us, vLLM-Ascend {up_us:.2f} us")  # fmt: skip


# Run in the JIT Python after the build (`up`: upstream's torch extension): the descriptor call's
# fixed cost with CPU torch tensors, as the manager passes them every layer (upstream's at::Tensor
# arguments against kvpd's checks of the same tensors); the two modules take turns.
TORCH_CALL_COST = """
import statistics, torch
import kvpd.native.ascend_planner as kv
R, K, C = 64, 2048, 4096
i32, i64 = torch.int32, torch.int64
t = [torch.zeros(R, dtype=i32), torch.zeros(R, K, dtype=i32), torch.zeros(R, K, dtype=i32),
     torch.zeros(R, 1024, dtype=i32)]
o = [torch.zeros(2 * R * K, dtype=i64), torch.zeros(2 * R * K, dtype=i64),
     torch.zeros(2 * R * K, dtype=i32), torch.zeros(1, dtype=i32)]
def cost(mod):
    s = time.perf_counter()
    mod.compute_lru_resident_addrs(*t, 128, 1024, 128, 0, 0, 0, 0, C, 1, *o)
    return (time.perf_counter() - s) * 1e6
ks, us = [], []
for _ in range(2000):
    ks.append(cost(kv))
    us.append(cost(up))
print(statistics.median(ks), statistics.median(us))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--upstream-cpp", type=Path, default=os.environ.get("KVPD_UPSTREAM_PLANNER_CPP") or None,
        help="vLLM-Ascend's sparse_kv_offload.cpp (default: $KVPD_UPSTREAM_PLANNER_CPP, as the "
        "equivalence tests take it)",
    )  # fmt: skip
    ap.add_argument("--jit-python", help="Python with torch + ninja, to time the JIT build")
    ap.add_argument(
        "--held-core", action="store_true",
        help="then compare again with every CPU but the first held by a spinning process",
    )  # fmt: skip
    ap.add_argument(
        "--held-core-limit", type=float, default=900.0,
        help="seconds after which each spinning process ends itself (default 900)",
    )  # fmt: skip
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--all-isas", action="store_true", help="also time kvpd's lower ISA paths")
    a = ap.parse_args()
    stop_on_termination()  # SIGTERM/SIGHUP stop the spinning process too, as Ctrl-C does
    upstream = None
    if a.upstream_cpp is None:
        print("vLLM-Ascend's planner: skipped (pass --upstream-cpp PATH to compare)")
    elif not a.upstream_cpp.is_file():
        print(f"vLLM-Ascend's planner: skipped ({a.upstream_cpp} does not exist)")
        a.upstream_cpp = None
    else:
        upstream = build_upstream(a.upstream_cpp)
    info = kvpd_mod.isa_info()
    isas = info["available"] if a.all_isas else [info["isa"]]
    steps = 6 if a.quick else 15
    a.repeats = 1 if a.quick else a.repeats
    trace = synthetic_topk_trace(steps=steps, rows=ROWS, topk=TOPK, max_model_len=MML,
                                 overlap=0.8, new_requests_per_step=2, seed=1)  # fmt: skip
    # Block ids below 16384 so upstream's 32-bit address products stay exact and the outputs
    # can be compared (kvpd is exact for any id; see tests/unit/test_ascend_planner.py).
    bt = np.random.default_rng(0).integers(0, 16_384, (ROWS, MML // BLOCK)).astype(np.int32)
    print(f"shape: rows={ROWS} topk={TOPK} capacity={CAP} max_model_len={MML} block={BLOCK}; "
          f"kvpd row planner: {info['isa']} (CPU offers {', '.join(info['available'])}); "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    compare(a, trace, bt, upstream, isas, [])
    cpus = sorted(os.sched_getaffinity(0))
    if a.held_core and len(cpus) < 2:
        print("\n--held-core: skipped (this process may use one CPU only)")
    elif a.held_core:
        # Every CPU but the first: the 1-thread turns keep a free core, the 2-thread turns' second
        # thread has none of its own (on a larger machine it would otherwise take a free one).
        held = cpus[1:]
        print(f"\n=== again, with CPU {', '.join(map(str, held))} held by a spinning process "
              "each (a stand-in for the engine's threads on a decode host's cores) "
              "===")  # fmt: skip
        with cores_held(held, a.held_core_limit) as spinners:
            compare(a, trace, bt, upstream, isas, spinners)
    if a.jit_python:
        jit_vs_import(a.jit_python, a.upstream_cpp)


if __name__ == "__main__":
    main()
