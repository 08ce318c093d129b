"""The rehearsal engines: what runs in place of each real engine process in a rehearsal (pure).

- `CpuVllm` (`--rehearse`, the default): a CPU `vllm serve` of a tiny model; KV connectors that
  need Ascend (MemFabric, memcache clients, Mooncake's ascend transport, UCM) become vLLM's
  ExampleConnector over a folder shared by all hosts (prefill writes, decode reads: the
  centralized-P/D data path). Real inference and real KV hand-over: the engine for KV proofs.
- `StandIn` (`--rehearse-with standin`): `kvpd/testing/standin_engine.py`, a stdlib-only
  process that speaks the OpenAI API, the P/D handshake (`kv_transfer_params`) and vLLM's
  `/metrics` counters, and does no inference; a decode with sparse KV offload also runs the
  sparse planner the plan chose (kvpd's native core from the node bundle, with NumPy) on every
  request, as vLLM-Ascend's decode does at every step. Each one carries the real process's
  command line, environment, config files and listening ports, so a topology rehearsal runs at
  the real size (every DP rank, every host) on a few CPU cores.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kvpd.plan.engine_argv import addr
from kvpd.plan.processes import ProcessDraft, StatedNeeds
from kvpd.plan.rehearsal_mode import CPU_VLLM, STANDIN
from kvpd.plan.requirements import python_of
from kvpd.plan.sparse_planner import planner_env, sparse_planner
from kvpd.profile.roles import Role
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
    # kvpd's cache folder on the host, shared by its deployments and kept by `down --purge`
    # (see the local profile): cold, they cost a CPU engine's start ~27 s on 2 cores.
    ("VLLM_CACHE_ROOT", "${HOME}/.cache/kvpd/vllm"),
    ("TORCHINDUCTOR_CACHE_DIR", "${HOME}/.cache/kvpd/inductor"),
    ("XDG_CACHE_HOME", "cache/xdg"),
)
# No VLLM_RPC_BASE_PATH/TMPDIR under the run dir: a seed profile has no `runtime.dirs` to create
# them, and ZMQ cannot bind an IPC socket in a missing folder. The host's /tmp serves (socket
# names are UUIDs); the caches above are created on demand.
ROLE = {"prefill": "kv_producer", "decode": "kv_consumer", "mixed": "kv_both"}
# vLLM's ExampleConnector without its negative hit count (from the node bundle: the rehearsal's
# CPU engines with a KV connector import kvpd).
REHEARSAL_CONNECTOR_MODULE = "kvpd.connectors.example_rehearsal"


def endpoint(profile: Profile, real: ProcessDraft) -> tuple[str, int]:
    """Where the real engine answers (address, HTTP port): its substitute answers there too."""
    return addr(profile, real.host), real.ports[0][0]


class CpuVllm:
    """CPU vLLM of the rehearsal's tiny model, ExampleConnector for every KV connector."""

    name = CPU_VLLM

    def substitute(
        self, profile: Profile, group: Group, real: ProcessDraft, index: int
    ) -> ProcessDraft:
        rh = profile.rehearsal
        a, port = endpoint(profile, real)
        argv = [rh.vllm, "serve", rh.model, "--host", a, "--port", str(port)]
        argv += ["--served-model-name", profile.model.served_name or profile.model.path]
        argv += list(CPU_ENGINE_ARGS)
        dp = _whole_dp(real.argv)
        if dp > 1:  # one process running every DP rank (vLLM starts them): so does the rehearsal
            argv += ["--data-parallel-size", str(dp)]
        if group.kv_connectors:
            kv = {
                "kv_connector": "KvpdExampleConnector",
                "kv_connector_module_path": REHEARSAL_CONNECTOR_MODULE,
                "kv_role": ROLE[real.role],
                "kv_connector_extra_config": {"shared_storage_path": rh.storage},
            }
            argv += ["--kv-transfer-config", json.dumps(kv, separators=(", ", ": "))]
        seed = profile.env.get("PYTHONHASHSEED") or (group.env or {}).get("PYTHONHASHSEED") or "0"
        env = (
            ("PYTHONHASHSEED", seed),
            # DP ranks are engine-core processes of their own: vLLM's multiprocessing stays on
            *(kv for kv in CPU_ENV if dp == 1 or kv[0] != "VLLM_ENABLE_V1_MULTIPROCESSING"),
            ("VLLM_HOST_IP", a),
            # DP ranks: vLLM's own placement (one core per rank, one core kept free)
            ("VLLM_CPU_OMP_THREADS_BIND", str(index % rh.cores) if dp == 1 else "auto"),
            # as on the real decode: the kvpd plugin reads it (no sparse offload manager on CPU)
            *(planner_env(group).items() if real.role == Role.DECODE else ()),
        )
        return ProcessDraft(
            name=real.name,
            host=real.host,
            role=real.role,
            stage=real.stage,
            argv=tuple(argv),
            env=env,
            ports=((port, "http"),),
            health_url=f"http://{a}:{port}/health",
            devices=(index % rh.cores,),
            health_timeout_s=rh.health_timeout_s,
            needs=StatedNeeds(
                packages=((python_of(rh.vllm), "vllm"),),
                paths=(rh.model,),
                shared_dirs=(rh.storage,) if group.kv_connectors else (),
            ),
        )

    def note(self, profile: Profile, group: Group) -> str:
        comps = "+".join(group.kv_connectors) or "no KV connector"
        return (
            f"CPU vllm serve of {profile.rehearsal.model} instead of {profile.model.path} "
            f"(dp {group.dp} tp {group.tp}); {comps} -> ExampleConnector (kvpd's, no "
            "negative hit count)"
        )


def _whole_dp(argv: tuple[str, ...]) -> int:
    """The DP size of a real engine process that runs all its ranks itself (no
    --data-parallel-rank: vLLM starts one engine core per rank), else 1."""
    if "--data-parallel-rank" in argv or "--data-parallel-size" not in argv:
        return 1
    return int(argv[argv.index("--data-parallel-size") + 1])


def sparse_model_args(profile: Profile) -> list[str]:
    """What a decode's sparse KV offload planner takes from the model's config.json, which the
    stand-in does not have: the indexer's top-k and the bytes of one token's K (latent) and V
    (rope) in the host pool (BF16, the only dtype sparse offload takes). The rest (hot-buffer
    size, rows, longest context) the stand-in reads from the real command line, as vLLM-Ascend
    does."""
    m = profile.model
    args = ["--sparse-topk", str(m.index_topk)] if m.index_topk else []
    if m.kv_lora_rank and m.qk_rope_head_dim:
        args += ["--sparse-token-bytes", f"{2 * m.kv_lora_rank},{2 * m.qk_rope_head_dim}"]
    return args


# The stand-in runs as a script (stdlib only), from the kvpd source every host sees: the test
# bed shares this checkout; on other hosts the node bundle installs kvpd at the same path.
STANDIN_SCRIPT = str(Path(__file__).resolve().parents[1] / "testing" / "standin_engine.py")
# Beside it: a sparse-offload decode's planner calls (NumPy and kvpd's native core, the bundle's).
STANDIN_SPARSE = str(Path(STANDIN_SCRIPT).with_name("standin_sparse.py"))


class StandIn:
    """kvpd's stand-in engine carrying the real process's command line, environment and ports."""

    name = STANDIN

    def substitute(
        self, profile: Profile, group: Group, real: ProcessDraft, index: int
    ) -> ProcessDraft:
        rh = profile.rehearsal
        a, port = endpoint(profile, real)
        argv = [rh.standin_python_on(real.host), STANDIN_SCRIPT, "--host", a, "--port", str(port)]
        argv += ["--role", real.role]
        argv += ["--served-model-name", profile.model.served_name or profile.model.path]
        argv += ["--block-size", str(profile.model.block_size)]
        for extra, _why in real.ports[1:]:  # side channels and DP RPC: held, as the real binds
            argv += ["--hold-port", str(extra)]
        paths: tuple[str, ...] = (STANDIN_SCRIPT,)
        if real.role == Role.DECODE and sparse_planner(group) is not None:
            argv += sparse_model_args(profile)
            paths += (STANDIN_SPARSE,)
        argv += ["--", *real.argv]  # the guide's command line, verbatim (shown by ps and logs)
        return dataclasses.replace(
            real,
            argv=tuple(argv),
            source=(),  # the Ascend set_env scripts do not exist on CPU hosts
            health_url=f"http://{a}:{port}/health",
            health_timeout_s=min(120.0, rh.health_timeout_s),
            needs=StatedNeeds(paths=paths),
        )

    def note(self, profile: Profile, group: Group) -> str:
        return (
            f"kvpd stand-in engine (no inference) with the real command, environment and ports "
            f"of {profile.model.path} (dp {group.dp} tp {group.tp})"
        )
