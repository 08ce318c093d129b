"""The `proxy:` timeouts and routing options of a profile as `kvpd proxy` flags (pure).

Only what the profile sets is rendered; unset fields leave kvpd's proxy at its defaults, which
wait for a prefill and for a decoder's first byte without limit, as vLLM-Ascend's proxies do,
bound only the silence between a decoder's stream chunks, and route prefills by cache."""

from __future__ import annotations

from kvpd.plan.layout import merged
from kvpd.plan.sizing import kv_bytes_per_token, parse_size
from kvpd.profile.schema import Profile, Proxy

# profile field -> `kvpd proxy` flag
PROXY_TIMEOUTS: tuple[tuple[str, str], ...] = (
    ("connect_timeout_s", "--connect-timeout"),
    ("prefill_timeout_s", "--prefill-timeout"),
    ("first_byte_timeout_s", "--first-byte-timeout"),
    ("read_timeout_s", "--read-timeout"),
)


def proxy_timeout_args(px: Proxy) -> list[str]:
    out: list[str] = []
    for fieldname, flag in PROXY_TIMEOUTS:
        v = getattr(px, fieldname)
        if v is not None:
            out += [flag, f"{v:g}"]
    return out


def set_timeouts(px: Proxy) -> list[str]:
    """The timeout fields the profile sets."""
    return [f for f, _ in PROXY_TIMEOUTS if getattr(px, f) is not None]


# profile field -> `kvpd proxy` flag (a bool: the flag alone when true)
PROXY_ROUTING: tuple[tuple[str, str], ...] = (
    ("routing", "--routing"),
    ("prefix_capacity_tokens", "--prefix-capacity-tokens"),
    ("decode_affinity", "--decode-affinity"),
)


def proxy_routing_args(profile: Profile, backends: int) -> list[str]:
    """The routing flags the profile sets; the prefix index's capacity, when unset, from the
    KV cache the profile gives each of the `backends` prefilling processes."""
    px = profile.proxy
    assert px is not None
    out: list[str] = []
    for fieldname, flag in PROXY_ROUTING:
        v = getattr(px, fieldname)
        if isinstance(v, bool):
            out += [flag] if v else []
        elif v is not None:
            out += [flag, str(v)]
    derived = None if px.prefix_capacity_tokens else cache_tokens(profile, backends)
    if derived:
        out += ["--prefix-capacity-tokens", str(derived)]
    return out


def cache_tokens(profile: Profile, backends: int) -> int | None:
    """Tokens of KV cache one prefilling process (prefill, else mixed) holds, where the profile
    sizes it: kv_cache_memory_bytes is per device; the devices of a rank split a token's KV
    (TP over the KV heads, a latent KV is replicated instead; PP over the layers), and the DP
    ranks of an instance each have their own cache. None where the profile leaves the size to
    vLLM (gpu_memory_utilization): the proxy's default then applies."""
    group = profile.prefill or profile.mixed
    per_token = kv_bytes_per_token(profile.model)
    if group is None or per_token is None or backends < 1:
        return None
    memory = merged(profile, group).kv_cache_memory_bytes
    if not memory:
        return None
    m = profile.model
    latent = m.attention in ("mla", "sfa", "dsa")
    split = group.pp * (1 if latent else max(1, min(group.tp, m.kv_heads or 1)))
    ranks = group.instances * group.dp
    return parse_size(memory) * split // per_token * ranks // backends


def set_routing(px: Proxy) -> list[str]:
    """The routing fields the profile sets."""
    return [f for f, _ in PROXY_ROUTING if getattr(px, f) is not None]
