"""An engine's `vllm serve` command line (pure): parallelism, serve options, connectors."""

from __future__ import annotations

import json
from typing import Any

from kvpd.plan.kvconfig import additional_config, kv_transfer_config
from kvpd.plan.layout import EnginePlacement
from kvpd.profile.schema import Group, Profile, ServeOptions


def addr(profile: Profile, host: str) -> str:
    return profile.hosts[host].address


def _flag(argv: list[str], name: str, value: Any) -> None:
    if value is None or value is False:
        return
    if value is True:
        argv.append(name)
    else:
        argv.extend([name, str(value)])


def _json(d: dict[str, Any]) -> str:
    return json.dumps(d, separators=(", ", ": "))


def _toggle(argv: list[str], name: str, value: bool | None) -> None:
    """`--name` or `--no-name` when the profile says, nothing when it leaves vLLM's default."""
    if value is not None:
        argv.append(f"--{name}" if value else f"--no-{name}")


def _parallel_args(profile: Profile, group: Group, ep: EnginePlacement) -> list[str]:
    argv = ["--data-parallel-size", str(group.dp)]
    if group.dp > 1 and ep.per_rank:
        dp_host = group.dp_address or group.hosts[0]
        if dp_host not in profile.hosts:  # reported by the rules; derive something sane
            dp_host = ep.host
        argv += ["--data-parallel-address", addr(profile, dp_host)]
        argv += ["--data-parallel-rpc-port", str(group.dp_rpc_port)]
        argv += ["--data-parallel-rank", str(ep.dp_ranks[0])]
    argv += ["--tensor-parallel-size", str(group.tp)]
    if group.pp > 1:
        argv += ["--pipeline-parallel-size", str(group.pp)]
    return argv


def _serve_args(profile: Profile, group: Group, opts: ServeOptions) -> list[str]:
    argv: list[str] = []
    _flag(argv, "--enable-expert-parallel", opts.enable_expert_parallel)
    _flag(argv, "--seed", opts.seed)
    _flag(argv, "--max-model-len", opts.max_model_len or profile.model.max_model_len)
    _flag(argv, "--max-num-batched-tokens", opts.max_num_batched_tokens)
    _flag(argv, "--max-num-seqs", opts.max_num_seqs)
    _flag(argv, "--trust-remote-code", opts.trust_remote_code)
    _flag(argv, "--gpu-memory-utilization", opts.gpu_memory_utilization)
    _flag(argv, "--quantization", opts.quantization)
    if opts.kv_cache_memory_bytes:
        argv += ["--kv-cache-memory-bytes", opts.kv_cache_memory_bytes]
    if profile.model.served_name:
        argv += ["--served-model-name", profile.model.served_name]
    eager = opts.enforce_eager
    if eager is None and group.layerwise is not None and "ascend_store" in group.kv_connectors:
        eager = True  # layerwise prefill offload requires eager mode; the code does not check
    _flag(argv, "--enforce-eager", eager)
    _flag(argv, "--block-size", opts.block_size)
    _toggle(argv, "enable-prefix-caching", opts.enable_prefix_caching)
    _toggle(argv, "enable-chunked-prefill", opts.enable_chunked_prefill)
    return argv


def _config_args(
    profile: Profile, group: Group, ep: EnginePlacement, opts: ServeOptions
) -> list[str]:
    argv: list[str] = []
    add = additional_config(group, opts.additional_config)
    if add:
        argv += ["--additional-config", _json(add)]
    if opts.compilation_config:
        argv += ["--compilation-config", _json(opts.compilation_config)]
    kvc = kv_transfer_config(profile, ep.role, group, ep)
    if kvc:
        argv += ["--kv-transfer-config", _json(kvc)]
    return argv


def engine_argv(
    profile: Profile, group: Group, ep: EnginePlacement, opts: ServeOptions
) -> list[str]:
    """`vllm serve` with the options of `group` for the engine placed at `ep`."""
    host = profile.hosts[ep.host]
    argv = [profile.runtime.vllm, "serve", profile.model.path]
    # the host's cluster address, not the guides' 0.0.0.0: no other network reaches the API
    argv += ["--host", opts.host or host.ip or host.address, "--port", str(ep.port)]
    argv += _parallel_args(profile, group, ep)
    argv += _serve_args(profile, group, opts)
    argv += _config_args(profile, group, ep, opts)
    return argv + list(opts.args or [])
