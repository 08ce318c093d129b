"""Time `kvpd plan` (parse + validate + derive + render) on generated profiles of many hosts.

Target: 1,024 hosts in under 2 s on a 2-core machine, growing linearly.
Usage: python benchmarks/plan_scale.py [64 256 1024]
"""

from __future__ import annotations

import sys
import time

import yaml

from kvpd.plan.build import build_plan
from kvpd.profile.load import parse_profile


def profile_text(n_hosts: int) -> str:
    """Half prefill, half decode hosts (8 NPUs each), large-EP style: one process per DP rank."""
    half = n_hosts // 2
    hosts = {
        f"h{i}": {"address": f"10.{i // 250}.{i % 250}.1", "nic": "eth0", "devices": 8}
        for i in range(n_hosts)
    }
    doc = {
        "name": f"scale-{n_hosts}",
        "hardware": "a2",
        "hosts": hosts,
        "model": {
            "path": "/models/m",
            "attention": "mla",
            "layers": 61,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "max_model_len": 16384,
        },
        "env": {"PYTHONHASHSEED": "0"},
        "kv": {"mooncake": {"host": "h0"}},
        "prefill": {
            "hosts": [f"h{i}" for i in range(half)],
            "dp": half,
            "tp": 8,
            "dp_size_local": 1,
            "port": 9000,
            "kv_port": 30000,
            "kv_connectors": ["mooncake"],
        },
        "decode": {
            "hosts": [f"h{i}" for i in range(half, n_hosts)],
            "dp": half * 2,
            "tp": 4,
            "dp_size_local": 2,
            "port": 9000,
            "kv_port": 30000,
            "kv_connectors": ["mooncake"],
        },
        "proxy": {"host": "h0", "port": 7000},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [64, 256, 1024]
    print(f"{'hosts':>6} {'processes':>9} {'files':>6} {'seconds':>8} {'ms/host':>8}")
    for n in sizes:
        text = profile_text(n)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            profile, source = parse_profile(text, f"scale-{n}.yaml")
            plan = build_plan(profile, source)
            best = min(best, time.perf_counter() - t0)
        print(
            f"{n:>6} {len(plan.processes):>9} {len(plan.files):>6} {best:>8.3f} "
            f"{best / n * 1000:>8.2f}"
        )


if __name__ == "__main__":
    main()
