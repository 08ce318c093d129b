"""The `proxy:` timeouts and routing options of a profile as `kvpd proxy` flags (pure).

Only what the profile sets is rendered; unset fields leave kvpd's proxy at its defaults, which
wait for a prefill and for a decoder's first byte without limit, as vLLM-Ascend's proxies do,
bound only the silence between a decoder's stream chunks, and route prefills by cache."""

from __future__ import annotations

from kvpd.profile.schema import Proxy

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


def proxy_routing_args(px: Proxy) -> list[str]:
    out: list[str] = []
    for fieldname, flag in PROXY_ROUTING:
        v = getattr(px, fieldname)
        if isinstance(v, bool):
            out += [flag] if v else []
        elif v is not None:
            out += [flag, str(v)]
    return out


def set_routing(px: Proxy) -> list[str]:
    """The routing fields the profile sets."""
    return [f for f, _ in PROXY_ROUTING if getattr(px, f) is not None]
