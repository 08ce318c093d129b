"""Rehearsal: a profile's real topology on CPU hosts (pure).

The same hosts, stages, process names, HTTP ports, proxy and bench; each engine becomes a CPU
`vllm serve` of a tiny model, and KV connectors that need Ascend (MemFabric, memcache clients,
Mooncake's ascend transport, UCM) become vLLM's ExampleConnector over a folder shared by all
hosts (prefill writes, decode reads: the centralized-P/D data path). The memcache MetaService
and the Mooncake master run for real. `kvpd plan --rehearse` shows every substitution.
"""

from __future__ import annotations

import json

from kvpd.plan.layout import EngineProc
from kvpd.plan.processes import Proc, addr
from kvpd.plan.sparse_planner import planner_env
from kvpd.profile.schema import Group, Profile

# Lean CPU flags (cpu-engine.md §7): eager, tiny KV cache, no chunked prefill (ExampleConnector
# breaks with it), block 32 (the CPU attention backend's smallest).
CPU_ENGINE_ARGS = (
    "--max-model-len",
    "512",
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    "16M",
    "--max-num-seqs",
    "16",
    "--max-num-batched-tokens",
    "4096",
    "--no-enable-chunked-prefill",
    "--block-size",
    "32",
    "--enable-prompt-tokens-details",
)
CPU_ENV = (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("DO_NOT_TRACK", "1"),
    ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
    ("VLLM_CACHE_ROOT", "cache/vllm"),
    ("TORCHINDUCTOR_CACHE_DIR", "cache/inductor"),
    ("XDG_CACHE_HOME", "cache/xdg"),
)
# No VLLM_RPC_BASE_PATH/TMPDIR under the run dir: a seed profile has no `runtime.dirs` to create
# them, and ZMQ cannot bind an IPC socket in a missing folder. The host's /tmp serves (socket
# names are UUIDs); the caches above are created on demand.
ROLE = {"prefill": "kv_producer", "decode": "kv_consumer", "mixed": "kv_both"}


def rehearsal_engine(
    profile: Profile, group: Group, ep: EngineProc, stage: int, index: int
) -> Proc:
    rh = profile.rehearsal
    a = addr(profile, ep.host)
    kv = None
    if group.kv_connectors:
        kv = {
            "kv_connector": "ExampleConnector",
            "kv_role": ROLE[ep.role],
            "kv_connector_extra_config": {"shared_storage_path": rh.storage},
        }
    argv = [rh.vllm, "serve", rh.model, "--host", a, "--port", str(ep.port)]
    argv += ["--served-model-name", profile.model.served_name or profile.model.path]
    argv += list(CPU_ENGINE_ARGS)
    if kv:
        argv += ["--kv-transfer-config", json.dumps(kv, separators=(", ", ": "))]
    seed = profile.env.get("PYTHONHASHSEED") or (group.env or {}).get("PYTHONHASHSEED") or "0"
    env = (
        ("PYTHONHASHSEED", seed),
        *CPU_ENV,
        ("VLLM_HOST_IP", a),
        ("VLLM_CPU_OMP_THREADS_BIND", str(index % rh.cores)),
        # as on the real decode: the kvpd plugin reads it (no sparse offload manager on CPU)
        *(planner_env(group).items() if ep.role == "decode" else ()),
    )
    return Proc(
        name=ep.name,
        host=ep.host,
        role=ep.role,
        stage=stage,
        argv=tuple(argv),
        env=env,
        ports=((ep.port, "http"),),
        health_url=f"http://{a}:{ep.port}/health",
        devices=(index % rh.cores,),
    )


def rehearsal_notes(profile: Profile, procs: list[Proc]) -> dict[str, str]:
    """What each process stands in for, shown by `kvpd plan --rehearse`."""
    notes: dict[str, str] = {}
    for p in procs:
        if p.role in ("prefill", "decode", "mixed"):
            g: Group = getattr(profile, p.role)
            comps = "+".join(g.kv_connectors) or "no KV connector"
            notes[p.name] = (
                f"CPU vllm serve of {profile.rehearsal.model} instead of {profile.model.path} "
                f"(dp {g.dp} tp {g.tp}); {comps} -> ExampleConnector"
            )
        elif p.role == "metaservice":
            notes[p.name] = "real memcache MetaService (CPU); no Ascend set_env scripts"
        elif p.role == "mooncake":
            notes[p.name] = "real mooncake_master (CPU, non-CUDA wheel)"
        elif p.role == "proxy":
            notes[p.name] = "kvpd proxy, prefill-first flow"
    return notes
