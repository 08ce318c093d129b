"""The `proxy:` timeouts of a profile as `kvpd proxy` flags (pure).

Only what the profile sets is rendered; unset fields leave kvpd's proxy at its defaults, which
wait for a prefill and for a decoder's first byte without limit, as vLLM-Ascend's proxies do,
and bound only the silence between a decoder's stream chunks."""

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
