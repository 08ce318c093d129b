"""What reaches a process unchecked unless refused here: extra `args`, pass-through config maps,
environment variables kvpd manages, and addresses that must be numeric."""

from __future__ import annotations

from kvpd.plan.rules.base import Checker, Path_
from kvpd.plan.rules.flags import (
    OPAQUE_FLAGS,
    SECRET_FLAG,
    SECRET_FLAG_WHY,
    arg_value,
    flag_name,
    resolve,
)
from kvpd.profile.schema import ASCEND
from kvpd.profile.types import HASHSEED_MAX, is_ip, is_ipv4

# `vllm serve` flags kvpd derives or checks -> the profile field to use instead.
MANAGED_FLAGS = {
    "--model": "model.path",
    "--host": "engine.host (or the group's host)",
    "--port": "the group's port",
    "--data-parallel-size": "the group's dp",
    "-dp": "the group's dp",
    "--data-parallel-size-local": "the group's dp_size_local",
    "-dpl": "the group's dp_size_local",
    "--data-parallel-address": "the group's dp_address",
    "-dpa": "the group's dp_address",
    "--data-parallel-rpc-port": "the group's dp_rpc_port",
    "-dpp": "the group's dp_rpc_port",
    "--data-parallel-rank": "the group's dp_launch: per_rank (kvpd numbers the ranks)",
    "-dpn": "the group's dp_launch: per_rank (kvpd numbers the ranks)",
    "--data-parallel-start-rank": "the group's dp_size_local (kvpd numbers the ranks)",
    "--tensor-parallel-size": "the group's tp",
    "-tp": "the group's tp",
    "--pipeline-parallel-size": "the group's pp",
    "-pp": "the group's pp",
    "--decode-context-parallel-size": "the group's cp",
    "-dcp": "the group's cp",
    "--prefill-context-parallel-size": "the group's cp",
    "-pcp": "the group's cp",
    "--block-size": "block_size (engine: or the group)",
    "--max-model-len": "model.max_model_len (or max_model_len on the group)",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "--seed": "seed",
    "--served-model-name": "model.served_name",
    "--trust-remote-code": "trust_remote_code",
    "--enforce-eager": "enforce_eager",
    "--quantization": "quantization",
    "-q": "quantization",
    "--enable-expert-parallel": "enable_expert_parallel",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching: false",
    "--enable-chunked-prefill": "enable_chunked_prefill",
    "--no-enable-chunked-prefill": "enable_chunked_prefill: false",
    "--kv-transfer-config": "the group's kv_connectors and kv.* settings",
    "--additional-config": "additional_config (or sparse_offload)",
    "--compilation-config": "compilation_config",
    "-O": "compilation_config",
}
# Environment variables kvpd sets per process; a profile value would silently override them.
MANAGED_ENV = {
    "MMC_LOCAL_CONFIG_PATH": "kv.memcache (kvpd writes conf/mmc-local.conf)",
    "MMC_META_CONFIG_PATH": "kv.memcache (kvpd writes conf/mmc-meta.conf)",
    "MOONCAKE_CONFIG_PATH": "kv.mooncake (kvpd writes conf/mooncake.json)",
    "ASCEND_RT_VISIBLE_DEVICES": "hosts.<host>.devices, tp and dp (kvpd assigns devices)",
    "CUDA_VISIBLE_DEVICES": "hosts.<host>.devices, tp and dp (kvpd assigns devices)",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "the group's kv_port",
    "VLLM_DP_RANK": "the group's dp_launch",
    "VLLM_DP_SIZE": "the group's dp",
}
NUMERIC_ENV = ("HCCL_IF_IP", "VLLM_HOST_IP")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's other names for them
MANAGED_ADDITIONAL = {"sparse_kv_offload_config": "the decode group's sparse_offload"}


def _env_places(c: Checker) -> list[tuple[Path_, dict[str, str]]]:
    places: list[tuple[Path_, dict[str, str]]] = [(("env",), dict(c.p.env))]
    if c.p.engine.env:
        places.append((("engine", "env"), dict(c.p.engine.env)))
    for role, g in c.groups():
        if g.env:
            places.append(((role, "env"), dict(g.env)))
    return places


def rule_args(c: Checker) -> None:
    """Extra `args` must not re-set what kvpd derives or checks (that would bypass the rules),
    in any spelling vLLM accepts (`_` for `-`, `--flag.key=v`, abbreviations, `--no-`)."""
    places: list[tuple[Path_, list[str]]] = []
    if c.p.engine.args:
        places.append((("engine", "args"), list(c.p.engine.args)))
    places += [((role, "args"), list(g.args)) for role, g in c.groups() if g.args]
    for path, args in places:
        for i, arg in enumerate(args):
            _check_arg(c, (*path, i), arg)
        dtype = arg_value(args, "--dtype")
        if dtype is not None and DTYPE_ALIASES.get(dtype, dtype) != c.p.model.dtype:
            c.err(
                path,
                f"--dtype {dtype} contradicts model.dtype {c.p.model.dtype}, which kvpd's rules "
                f"and sizing use; set model.dtype: {dtype}, or remove --dtype from args.",
            )
    for role, g in c.groups():
        add = (g.additional_config or {}) | (c.p.engine.additional_config or {})
        for key, use in MANAGED_ADDITIONAL.items():
            if key in add:
                c.err(
                    (role, "additional_config", key),
                    f"{key} is written by kvpd (and checked); remove it and set {use} instead.",
                )


def _check_arg(c: Checker, where: Path_, arg: str) -> None:
    if arg.startswith("-") and any(ch.isspace() for ch in arg.split("=", 1)[0]):
        c.err(
            where,
            f"{arg!r} holds a space in a flag, so vLLM does not read it as one; give the flag "
            "and its value as two list entries (e.g. [--flag, value]).",
        )
        return
    name = flag_name(arg)
    managed = resolve(name, MANAGED_FLAGS)
    if managed is not None:
        spelled = name if name == managed else f"{name} (vLLM reads it as {managed})"
        c.err(
            where,
            f"{spelled} is set by kvpd from the profile (and checked against the other "
            f"groups); remove it from args and set {MANAGED_FLAGS[managed]} instead.",
        )
        return
    opaque = resolve(name, OPAQUE_FLAGS)
    if opaque is not None:
        why, fix = OPAQUE_FLAGS[opaque]
        c.err(where, f"{opaque} in args {why}; {fix}.")
    elif SECRET_FLAG.match(name):
        c.err(
            where,
            f"{name} in args {SECRET_FLAG_WHY}; pass the secret through the group's env (a "
            "variable named *_KEY, *_TOKEN or *_PASSWORD is masked in every plan and log).",
        )


def rule_env(c: Checker) -> None:
    for path, env in _env_places(c):
        for name, value in env.items():
            if name in MANAGED_ENV:
                c.err(
                    (*path, name),
                    f"{name} is set by kvpd for each process; remove it and use "
                    f"{MANAGED_ENV[name]} instead.",
                )
            elif name in NUMERIC_ENV and not is_ip(value):
                c.err(
                    (*path, name),
                    f"{value!r} is not a numeric IP address; {name} must be one "
                    "(e.g. 192.168.10.1). Leave it unset to use the host's address.",
                )
            elif name == "PYTHONHASHSEED" and not (
                value.isascii() and value.isdigit() and int(value) <= HASHSEED_MAX
            ):
                c.err(
                    (*path, name),
                    f"{value!r} is not an integer in [0, {HASHSEED_MAX}]; block hashes only "
                    'match with one fixed number everywhere. Write e.g. PYTHONHASHSEED: "0".',
                )


def rule_numeric_ips(c: Checker) -> None:
    """MemFabric and HCCL need a numeric IP; kvpd does not resolve names while planning."""
    reported: set[str] = set()
    for gf in c.gfacts():
        sfa = "sfa_d2h" in gf.connectors
        for h in gf.group.hosts:
            host = c.p.hosts.get(h)
            if host is None or h in reported:
                continue
            ip = host.ip or host.address
            needs = []
            if host.nic and c.f.hardware(h) in ASCEND and "HCCL_IF_IP" not in gf.env:
                needs.append("HCCL_IF_IP")
            if (sfa or host.nic) and "VLLM_HOST_IP" not in gf.env:
                needs.append("VLLM_HOST_IP")
            if not needs:
                continue
            reported.add(h)
            if sfa and not is_ipv4(ip):
                c.err(
                    ("hosts", h, "ip" if host.ip else "address"),
                    f"{gf.role} on '{h}' uses SfaRemoteD2H, whose MemFabric peer address "
                    f"({', '.join(needs)}) must be a numeric IPv4 address, not {ip!r}. Set "
                    f"`hosts.{h}.ip` to the host's IPv4 address.",
                    on_hardware=True,
                )
            elif not is_ip(ip):
                field = "ip" if host.ip else "address"
                c.err(
                    ("hosts", h, field),
                    f"{', '.join(needs)} of {gf.role} on '{h}' needs a numeric IP, but the "
                    f"{field} is the name {ip!r} (kvpd does not resolve names while "
                    f"planning). Set `hosts.{h}.ip` to its IP address.",
                    on_hardware=True,
                )
