"""Time a topology rehearsal of a generated N-host profile on the SSH test bed: `kvpd up
--rehearse-with standin` and `kvpd down`, i.e. kvpd's own overhead at that size (the stand-in
engines are healthy within a fraction of a second, so nearly all of `up` is kvpd: SSH sessions,
files, starts, health gates).

The profile is benchmarks/plan_scale.py's (half prefill hosts with one DP rank each, half
decode hosts with two, a Mooncake master and kvpd's proxy). Root only (the bed is network
namespaces). It brings the bed up to N hosts (`scripts/testbed.sh up N`, one sshd per host) and
leaves it up (`scripts/testbed.sh down` stops it); set KVPD_TESTBED_DIR, PFX and NET as for the
e2e tests.

It also times `kvpd status` two ways in the same run: from the folder `up` ran in (its local
cache names the profile) and from a folder without any state, given the profile and inventory
(every host's record read and validated): host records are the truth either way, so the two
should cost about the same (target: at most 2x).

Usage: python benchmarks/rehearsal_scale.py [N=64]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from plan_scale import profile_text

from kvpd.testing.termination import stop_on_termination

REPO = Path(__file__).resolve().parents[1]


def bed_up(n: int) -> tuple[Path, dict[str, str]]:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(["bash", str(REPO / "scripts" / "testbed.sh"), "up", str(n)], check=True,
                   env=env, capture_output=True)  # fmt: skip
    bed = Path(os.environ.get("KVPD_TESTBED_DIR") or REPO / ".kvpd" / "testbed").resolve()
    rows = (bed / "hosts").read_text().split("\n")
    return bed, dict(r.split()[:2] for r in rows if r.strip())


def inventory(bed: Path, addresses: dict[str, str], n: int, storage: Path) -> dict[str, object]:
    return {
        "hosts": {f"h{i}": {"address": addresses[f"h{i + 1}"]} for i in range(n)},
        "ssh": {"user": "root", "key": str(bed / "id_ed25519"),
                "known_hosts": str(bed / "known_hosts")},
        "rehearsal": {
            "kvpd": str(REPO / ".venv" / "bin" / "kvpd"),
            "python": str(REPO / ".venv-services" / "bin" / "python"),
            "mooncake_master": str(REPO / ".venv-services" / "bin" / "mooncake_master"),
            "storage": str(storage),
        },
    }  # fmt: skip


def kvpd(state: Path, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["KVPD_STATE_DIR"] = str(state)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "kvpd.cli.main", *args], env=env, cwd=state.parent,
                       capture_output=True, text=True, timeout=1800)  # fmt: skip
    return time.perf_counter() - t0, r


def status_twice(
    state: Path, name: str, prof: Path, inv: Path, runs: int = 3
) -> tuple[float, float, int, int]:
    """Best of `runs` of `status` with the cache and from a stateless folder, alternating (so
    load drifts hit both alike); the processes each reports alive."""
    bare = state.parent / "elsewhere" / "state"
    bare.parent.mkdir(exist_ok=True)
    cached, fresh, alive = [], [], [0, 0]
    for _ in range(runs):
        for i, (times, where, args) in enumerate((
            (cached, state, ["status", name, "--json"]),
            (fresh, bare, ["status", str(prof), "--rehearse-with", "standin",
                           "--inventory", str(inv), "--json"]),
        )):  # fmt: skip
            s, r = kvpd(where, *args)
            if r.returncode != 0:
                raise SystemExit(f"kvpd {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
            times.append(s)
            alive[i] = sum(p["alive"] for p in json.loads(r.stdout)["processes"])
    if (bare / name / "state.json").exists():
        raise SystemExit("a status from elsewhere wrote a cache there")
    return min(cached), min(fresh), alive[0], alive[1]


def machine() -> str:
    load = os.getloadavg()
    flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0]
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "base"
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                  .splitlines() if ln.startswith("model name")), "?")  # fmt: skip
    cores = os.cpu_count()
    return f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; CPU {model} ({isa}, {cores} cores)"


def main() -> None:
    stop_on_termination()  # SIGTERM/SIGHUP run the cleanup below, as Ctrl-C does
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    t0 = time.perf_counter()
    bed, addresses = bed_up(n)
    print(f"bed of {n} hosts up in {time.perf_counter() - t0:.1f} s (not kvpd)")
    with tempfile.TemporaryDirectory(prefix="kvpd-scale-", dir=REPO / ".kvpd") as tmp:
        work = Path(tmp)
        prof, inv, state = work / f"scale-{n}.yaml", work / "inventory.yaml", work / "state"
        prof.write_text(profile_text(n))
        inv.write_text(yaml.safe_dump(inventory(bed, addresses, n, work / "kv")))
        name = f"scale-{n}"
        try:
            up_s, r = kvpd(state, "up", str(prof), "--rehearse-with", "standin", "--inventory",
                           str(inv), "--yes", "--json", "--skip-preflight")  # fmt: skip
            if r.returncode != 0:
                raise SystemExit(f"kvpd up failed:\n{r.stdout}\n{r.stderr}")
            procs = json.loads(r.stdout)["processes"]
            plan = json.loads((state / name / "state.json").read_text())["plan"]
            proxy = plan["proxy_url"]
            body = json.dumps({"model": plan["served_model"], "prompt": "x " * 600,
                               "max_tokens": 4}).encode()  # fmt: skip
            t1 = time.perf_counter()
            for _ in range(20):
                req = urllib.request.Request(
                    proxy + "/v1/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                urllib.request.urlopen(req, timeout=30).read()
            per_req = (time.perf_counter() - t1) / 20
            st_s, st_fresh_s, alive, alive_fresh = status_twice(state, name, prof, inv)
        finally:
            down_s, r = kvpd(state, "down", name, "--json")
        clean = r.returncode == 0 and json.loads(r.stdout)["clean"]
    print(f"{'hosts':>6} {'procs':>6} {'up s':>7} {'status s':>9} {'down s':>7} {'ms/host up':>11}")
    print(f"{n:>6} {len(procs):>6} {up_s:>7.2f} {st_s:>9.2f} {down_s:>7.2f} "
          f"{up_s / n * 1000:>11.1f}")  # fmt: skip
    print(f"alive after up: {alive}/{len(procs)}; a request through the proxy: "
          f"{per_req * 1000:.1f} ms; down clean: {clean}")  # fmt: skip
    print(
        f"status with the local cache: {st_s:.2f} s; from a folder without state (profile + "
        f"inventory, every host record read): {st_fresh_s:.2f} s "
        f"({alive_fresh}/{len(procs)} alive); ratio {st_fresh_s / st_s:.2f}x (target <= 2x)"
    )
    print(machine())


if __name__ == "__main__":
    main()
