"""Profile models of `bench:`: the defaults, sweeps and scenarios of `kvpd bench`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from kvpd.profile.base import _Model
from kvpd.profile.kv_schema import KvComponent
from kvpd.profile.types import HostName

Positive = Annotated[int, Field(ge=1)]
MAX_PROMPTS = 1_000_000  # per bench run: the client builds every prompt before it sends one


class BenchSweep(_Model):
    """Lists `kvpd bench` sweeps over (cross product); empty: the single value of `bench`."""

    input_len: list[Positive] = Field(default_factory=list)
    output_len: list[Positive] = Field(default_factory=list)
    max_concurrency: list[Positive] = Field(default_factory=list)


# What a scenario's bench proof checks from /metrics (see BenchScenario.cache).
CacheCheck = Literal["none", "hbm", "external"]


class BenchScenario(_Model):
    """One `kvpd bench` scenario: what it changes, and which cache the proof expects."""

    sets: list[str] = Field(default_factory=list, description="`--set` overrides")
    without: list[KvComponent] = Field(
        default_factory=list,
        description="KV connectors to detach from every group (e.g. the external store: [ucm])",
    )
    cache: CacheCheck | None = Field(
        None,
        description="what the bench proof checks from /metrics: none = zero HBM and zero "
        "external prefix-cache hits, hbm = zero external hits, external = external hits > 0 "
        "(unset: no cache check)",
    )


class Bench(_Model):
    """Defaults of `kvpd bench` (the guides' `vllm bench serve` protocol)."""

    input_len: int = Field(1024, ge=1)
    output_len: int = Field(128, ge=1)
    num_prompts: int = Field(10, ge=1, le=MAX_PROMPTS)
    request_rate: Annotated[float, Field(gt=0)] | Literal["inf"] = "inf"
    max_concurrency: int | None = Field(None, ge=1)
    seed: int = 123456
    ignore_eos: bool = True
    prefix_ratio: float = Field(0.8, gt=0, lt=1)
    protocol: Literal["plain", "prefix", "twice"] = "plain"
    sweep: BenchSweep | None = None
    host: HostName | None = Field(
        None,
        description="where `vllm bench serve` runs: a host of the profile (over SSH, with the "
        "model's path as tokenizer; results are copied back) or `local` (this machine). "
        "Default: this machine when it has vllm and the tokenizer, else the proxy's host",
    )
    scenarios: dict[str, BenchScenario] = Field(
        default_factory=dict,
        description="name -> {sets, without, cache} (a plain list is `sets`); `kvpd bench "
        "--scenario NAME` restarts the deployment with them. Presets: recompute, hbm, external.",
    )

    @field_validator("scenarios", mode="before")
    @classmethod
    def _list_is_sets(cls, v: Any) -> Any:
        """`name: [a=b, ...]` is short for `name: {sets: [a=b, ...]}` (no cache check)."""
        if isinstance(v, dict):
            return {k: {"sets": s} if isinstance(s, list) else s for k, s in v.items()}
        return v

    @field_validator("scenarios")
    @classmethod
    def _overrides(cls, v: dict[str, BenchScenario]) -> dict[str, BenchScenario]:
        for name, scn in v.items():
            for item in scn.sets:
                key, eq, _ = item.partition("=")
                if not eq or not key.strip():
                    raise ValueError(
                        f"scenario {name!r}: {item!r} is not FIELD.PATH=VALUE; write e.g. "
                        "kv.ucm.use_layerwise=false"
                    )
        return v
