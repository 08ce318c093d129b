"""The plan's bench defaults as a frozen value (pure). Every default is the schema's
(`kvpd.profile.schema.Bench`); nothing here restates one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

from kvpd.profile.bench_schema import CacheCheck
from kvpd.profile.schema import Bench, BenchScenario

# Connectors that are a prefix cache of their own (an external KV store), as opposed to the
# P2P connectors (mooncake, mooncake_layerwise, nixl, sfa_d2h) that only move KV from P to D.
STORE_CONNECTORS: tuple[str, ...] = ("ucm", "kvpd_store", "ascend_store", "example")

# The protocol names, as the schema spells them.
PROTOCOLS: tuple[str, ...] = get_args(Bench.model_fields["protocol"].annotation)


@dataclass(frozen=True)
class BenchSweep:
    """Lists `kvpd bench` sweeps over (cross product); empty: the single value."""

    input_len: tuple[int, ...] = ()
    output_len: tuple[int, ...] = ()
    max_concurrency: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScenarioSpec:
    """A profile's `bench.scenarios` entry: `--set` overrides, KV connectors to detach, and
    the cache the proof expects (None: no cache check)."""

    sets: tuple[str, ...] = ()
    without: tuple[str, ...] = ()
    cache: CacheCheck | None = None


@dataclass(frozen=True)
class BenchSpec:
    """`kvpd bench` defaults from the profile (field order is plan.json's)."""

    input_len: int
    output_len: int
    num_prompts: int
    request_rate: float | str  # a positive number or "inf"
    max_concurrency: int | None
    seed: int
    ignore_eos: bool
    prefix_ratio: float
    protocol: str
    sweep: BenchSweep | None
    scenarios: dict[str, ScenarioSpec] = field(default_factory=dict)
    host: str | None = None  # where the client runs ("local": this machine; None: choose)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchSpec:
        """From plan.json (the schema fills what an older plan lacks)."""
        return bench_spec(Bench.model_validate(d))


def bench_spec(b: Bench) -> BenchSpec:
    """The profile's `bench` section as the plan's value."""
    s = b.sweep
    return BenchSpec(
        input_len=b.input_len,
        output_len=b.output_len,
        num_prompts=b.num_prompts,
        request_rate=b.request_rate,
        max_concurrency=b.max_concurrency,
        seed=b.seed,
        ignore_eos=b.ignore_eos,
        prefix_ratio=b.prefix_ratio,
        protocol=b.protocol,
        sweep=None
        if s is None
        else BenchSweep(tuple(s.input_len), tuple(s.output_len), tuple(s.max_concurrency)),
        scenarios={k: _scenario(v) for k, v in b.scenarios.items()},
        host=b.host,
    )


def _scenario(v: BenchScenario) -> ScenarioSpec:
    return ScenarioSpec(sets=tuple(v.sets), without=tuple(v.without), cache=v.cache)


def default_bench() -> BenchSpec:
    """The schema's defaults (for plans built by hand, e.g. in tests)."""
    return bench_spec(Bench())
