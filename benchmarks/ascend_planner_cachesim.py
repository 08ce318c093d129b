"""What a planned row costs in instructions, cache misses and branch mispredictions, per CPU.

Timings on this machine say nothing of a CPU it is not (the 2x against vLLM-Ascend's planner
held on Intel Ice Lake and AMD Zen 5, with 48 KiB of L1 data cache, and not reliably on Zen 3 and
Zen 4, with 32 KiB). Counts do: this runs one layer of the benchmark's trace (64 rows, top-k
2048, 4096 slots, 128k tokens; steps 4 to 15, one thread) under valgrind's callgrind, once for
each of several CPUs' published L1d and L2 geometries, through kvpd's portable row planner
(benchmarks/ascend_planner_cachesim.cpp) and, with --upstream-cpp, through vLLM-Ascend's own
planner built from that source. Per row it prints:

- instructions, loads, stores and conditional branches (the same on every CPU);
- branch mispredictions of callgrind's simulated predictor (a table of 2-bit counters, cruder
  than any real CPU's: the ratio between two planners is what it tells);
- L1d misses (reads + writes) and L2 misses for each CPU's caches (the L2 is simulated as the last
  level; the L3 and any prefetching are not: valgrind ignores prefetch instructions, so the
  row's state, which kvpd fetches ahead and a hardware prefetcher streams, counts in full).

The counts do not vary between runs or with the host's load. glibc's `rep stos`/`rep movs`
string routines are turned off for the count (GLIBC_TUNABLES): valgrind counts each of their
iterations as an instruction, where the CPU runs a whole 16 KiB memset in a few hundred cycles.

    .venv/bin/python benchmarks/ascend_planner_cachesim.py [--upstream-cpp PATH]

Needs valgrind (Debian's package) and, for vLLM-Ascend's planner, pybind11 and a shared
libpython (its source is compiled against kvpd's stand-in headers, as benchmarks/ascend_planner.py
does). Its build is `-O3 -march=x86-64-v3`, not `-march=native`: valgrind runs no AVX-512, and
that planner's loops are scalar.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ascend_planner_phases import CAP, MML, ROWS, STEPS, TOPK, write_trace

HERE = Path(__file__).resolve().parent
SRC = HERE / "ascend_planner_cachesim.cpp"
STUBS = HERE / "upstream_stubs"
WARM = 3  # steps planned before counting: the first steps fill every slot
# L1d and L2 (size, ways, line) as the vendors publish them; Kunpeng 920's ways are assumed.
CACHES = {
    "Zen 3": ((32 * 1024, 8, 64), (512 * 1024, 8, 64)),
    "Zen 4": ((32 * 1024, 8, 64), (1024 * 1024, 8, 64)),
    "Zen 5": ((48 * 1024, 12, 64), (1024 * 1024, 16, 64)),
    "Ice Lake SP": ((48 * 1024, 12, 64), (1280 * 1024, 20, 64)),
    "Kunpeng 920": ((64 * 1024, 4, 64), (512 * 1024, 8, 64)),
}
X86_ISAS = {
    "kvpd avx2": ["-march=x86-64-v2", "-mavx2", "-mbmi", "-mbmi2", "-mlzcnt", "-mfma"],
    "kvpd baseline": ["-march=x86-64-v2"],
}
UPSTREAM = "vLLM-Ascend"
EVENTS = "Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim".split()
NO_REP_STRINGS = (
    "glibc.cpu.x86_rep_stosb_threshold=0xffffffffff:glibc.cpu.x86_rep_movsb_threshold=0xffffffffff"
)


class Counts(NamedTuple):
    """Callgrind's totals for the counted steps, and the final state's digest."""

    events: dict[str, int]
    state: str


def compile_kvpd(out: Path, name: str, flags: list[str]) -> Path:
    exe = out / name.replace(" ", "-")
    cxx = os.environ.get("CXX", "g++")
    subprocess.run([cxx, "-O3", "-g", "-std=c++17", *flags, str(SRC), "-o", str(exe)], check=True)
    return exe


def compile_upstream(out: Path, cpp: Path) -> Path | str:
    """vLLM-Ascend's planner in the same harness, or why it cannot be built here."""
    try:
        import pybind11
    except ImportError:
        return "pybind11 is not installed"
    libdir, version = sysconfig.get_config_var("LIBDIR"), sysconfig.get_python_version()
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return "this Python has no shared libpython to link its pybind11 module code against"
    exe = out / "upstream"
    cmd = [
        os.environ.get("CXX", "g++"), "-O3", "-g", "-std=c++20", "-fopenmp", "-march=x86-64-v3",
        f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
        f"-I{STUBS / 'notorch'}", f"-I{STUBS / 'npu'}", "-DTORCH_EXTENSION_NAME=upstream",
        f'-DUPSTREAM_SOURCE="{cpp.resolve()}"', str(SRC), "-o", str(exe),
        f"-L{libdir}", f"-lpython{version}", f"-Wl,-rpath,{libdir}",
    ]  # fmt: skip
    if platform.machine().lower() not in ("x86_64", "amd64"):
        cmd.remove("-march=x86-64-v3")
    subprocess.run(cmd, check=True)
    return exe


def count(exe: Path, trace: Path, caches: tuple[tuple[int, int, int], ...]) -> Counts:
    """One run under callgrind with these L1d and L2 geometries; only measured_layer counts."""
    (d1, l2) = (",".join(map(str, c)) for c in caches)
    with tempfile.NamedTemporaryFile(prefix="kvpd-callgrind-", suffix=".out") as out:
        cmd = [
            "valgrind", "--tool=callgrind", "--cache-sim=yes", "--branch-sim=yes",
            f"--D1={d1}", f"--LL={l2}", "--I1=32768,8,64", "--collect-atstart=no",
            "--toggle-collect=*measured_layer*", f"--callgrind-out-file={out.name}",
            str(exe), str(trace), str(STEPS), str(ROWS), str(TOPK), str(CAP), str(MML), str(WARM),
        ]  # fmt: skip
        env = {**os.environ, "GLIBC_TUNABLES": NO_REP_STRINGS}
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        text = Path(out.name).read_text()
    summary = re.search(r"^summary: (.*)$", text, re.M)
    state = re.search(r"^state (\w+)$", done.stdout, re.M)
    if summary is None or state is None:
        raise RuntimeError(f"callgrind gave no summary for {exe.name}")
    values = [int(v) for v in summary.group(1).split()]
    return Counts(dict(zip(EVENTS, values + [0] * (len(EVENTS) - len(values)), strict=True)),
                  state.group(1))  # fmt: skip


def print_counts(results: dict[tuple[str, str], Counts]) -> None:
    rows = ROWS * (STEPS - WARM)
    names = sorted({name for name, _ in results}, key=lambda n: (n == UPSTREAM, n))
    first = next(iter(CACHES))
    print(f"\nper row ({rows} rows: steps {WARM + 1}-{STEPS} of {ROWS} rows), the same on every "
          "CPU:")  # fmt: skip
    print(f"  {'':>14} {'instructions':>12} {'loads':>8} {'stores':>8} {'branches':>9} "
          f"{'mispredicted':>12}")  # fmt: skip
    for name in names:
        e = results[(name, first)].events
        print(f"  {name:>14} {e['Ir'] / rows:12,.0f} {e['Dr'] / rows:8,.0f} "
              f"{e['Dw'] / rows:8,.0f} {(e['Bc'] + e['Bi']) / rows:9,.0f} "
              f"{(e['Bcm'] + e['Bim']) / rows:12,.1f}")  # fmt: skip
    print("\nL1d misses (reads + writes) / L2 misses per row, by CPU's caches (L1d, L2):")
    print(f"  {'':>14} " + " ".join(f"{c:>15}" for c in CACHES))
    print(f"  {'':>14} " + " ".join(f"{geometry(c):>15}" for c in CACHES))
    for name in names:
        cells = [misses(results[(name, cpu)].events, rows) for cpu in CACHES]
        print(f"  {name:>14} " + " ".join(f"{c:>15}" for c in cells))
    states = {c.state for c in results.values()}
    print(f"\nfinal state identical across {len(names)} planners: {len(states) == 1}")


def misses(e: dict[str, int], rows: int) -> str:
    """L1d misses / L2 misses per row, reads and writes together."""
    return f"{(e['D1mr'] + e['D1mw']) / rows:,.0f} / {(e['DLmr'] + e['DLmw']) / rows:,.0f}"


def geometry(cpu: str) -> str:
    (d1, _, _), (l2, _, _) = CACHES[cpu]
    return f"{d1 // 1024}K, {l2 // 1024}K"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream-cpp", type=Path,
                    default=os.environ.get("KVPD_UPSTREAM_PLANNER_CPP") or None,
                    help="vLLM-Ascend's sparse_kv_offload.cpp (default: "
                    "$KVPD_UPSTREAM_PLANNER_CPP)")  # fmt: skip
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("skipped: valgrind is not installed (Debian: apt-get install valgrind)")
        return
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    with tempfile.TemporaryDirectory(prefix="kvpd-cachesim-") as tmp:
        out = Path(tmp)
        write_trace(out)
        isas = X86_ISAS if x86 else {"kvpd baseline": []}
        exes: dict[str, Path] = {n: compile_kvpd(out, n, f) for n, f in isas.items()}
        if a.upstream_cpp is None:
            print("vLLM-Ascend's planner: skipped (pass --upstream-cpp PATH to compare)")
        elif not a.upstream_cpp.is_file():
            print(f"vLLM-Ascend's planner: skipped ({a.upstream_cpp} does not exist)")
        else:
            built = compile_upstream(out, a.upstream_cpp)
            if isinstance(built, str):
                print(f"vLLM-Ascend's planner: skipped ({built})")
            else:
                exes[UPSTREAM] = built
        jobs = [(name, cpu) for name in exes for cpu in CACHES]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            counted = pool.map(lambda j: count(exes[j[0]], out, CACHES[j[1]]), jobs)
            results = dict(zip(jobs, counted, strict=True))
    print(f"built on {platform.machine()}; counted by valgrind's callgrind, not timed")
    print_counts(results)


if __name__ == "__main__":
    main()
