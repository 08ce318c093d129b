"""The roles a process plays in a deployment, spelled once for the plan, executor and bench."""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    """A process's role. A `str`, so plan.json, state.json and comparisons with text are as
    before; the enum is for the code that groups processes by role."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"
    PROXY = "proxy"
    METASERVICE = "metaservice"
    MOONCAKE = "mooncake"

    def __str__(self) -> str:
        return self.value


# Engines, i.e. the profile's groups (a `mixed` group does prefill and decode).
ENGINE_ROLES: tuple[Role, ...] = (Role.PREFILL, Role.DECODE, Role.MIXED)
# Engines that compute prompts (count prefix-cache hits) and those that produce the tokens.
PREFILLING_ROLES: tuple[Role, ...] = (Role.PREFILL, Role.MIXED)
DECODING_ROLES: tuple[Role, ...] = (Role.DECODE, Role.MIXED)
# The processes besides the engines: the proxy and the KV services.
NON_ENGINE_ROLES: tuple[Role, ...] = (Role.METASERVICE, Role.MOONCAKE, Role.PROXY)
