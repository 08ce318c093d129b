"""What a bench run does: protocol, sweep points and scenarios, from the plan and the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpd.errors import BenchError
from kvpd.plan.bench import PROTOCOLS, STORE_CONNECTORS, BenchSpec, ScenarioSpec
from kvpd.plan.scenario_check import detach_sets
from kvpd.profile.bench_schema import CacheCheck

# The UCM guide's three setups, which every profile has (a profile's own entry of the same
# name replaces the preset): recompute = no prefix cache of any kind, hbm = vLLM's prefix cache
# only, external = the deployment as it is (its store must hit). `as-is` checks no cache.
PRESET_SCENARIOS: dict[str, ScenarioSpec] = {
    "recompute": ScenarioSpec(
        sets=("engine.enable_prefix_caching=false",), without=STORE_CONNECTORS, cache="none"
    ),
    "hbm": ScenarioSpec(
        sets=("engine.enable_prefix_caching=true",), without=STORE_CONNECTORS, cache="hbm"
    ),
    "external": ScenarioSpec(cache="external"),
    "as-is": ScenarioSpec(),
}


@dataclass(frozen=True)
class Scenario:
    """A resolved scenario: `sets` already include the connector removals."""

    name: str
    sets: tuple[str, ...] = ()
    cache: CacheCheck | None = None  # None: not checked
    without: tuple[str, ...] = ()  # connectors it detached (for the report)

    @property
    def expect_external(self) -> bool:
        return self.cache == "external"


def without_sets(
    name: str, connectors: dict[str, list[str]], without: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """`--set` values that detach `without` from every group, and the connectors detached.
    A store that is the only connector of a P/D group is its P->D path: taking it away would
    leave decode without KV, so that is refused rather than benched as something it is not."""
    sets, removed, blocked = detach_sets(connectors, without)
    if blocked is not None:
        have = connectors[blocked]
        raise BenchError(
            f"scenario {name!r}: {' + '.join(have)} is the only KV connector of {blocked}, "
            "the P->D path of this deployment; without it decode would get no KV. Define "
            f"the scenario in the profile instead (bench.scenarios.{name}: {{sets: [...], "
            "cache: none|hbm|external}}) with what this deployment can compare."
        )
    return sets, removed


@dataclass(frozen=True)
class Point:
    """One sweep point."""

    input_len: int
    output_len: int
    max_concurrency: int | None
    request_rate: float | str

    @property
    def key(self) -> str:
        c = "-" if self.max_concurrency is None else str(self.max_concurrency)
        return f"in{self.input_len}-out{self.output_len}-c{c}"


@dataclass(frozen=True)
class Settings:
    """The plan's bench defaults with the command line on top (see `make_settings`)."""

    protocol: str
    num_prompts: int
    seed: int
    ignore_eos: bool
    prefix_ratio: float
    points: tuple[Point, ...]


def int_list(text: str | None, what: str) -> list[int] | None:
    """ "128,256" -> [128, 256]; None stays None."""
    if text is None:
        return None
    try:
        out = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        raise BenchError(f"{what}: expected comma-separated integers, got {text!r}.") from None
    if not out or any(v < 1 for v in out):
        raise BenchError(f"{what}: expected positive integers, got {text!r}.")
    return out


def parse_rate(v: Any) -> float | str:
    if v is None or v == "inf" or v == float("inf"):
        return "inf"
    try:
        r = float(v)
    except (TypeError, ValueError):
        raise BenchError(f"request rate: expected a number or inf, got {v!r}.") from None
    if r <= 0:
        raise BenchError(f"request rate must be positive, got {v!r}.")
    return r


def make_settings(
    bench: BenchSpec,
    *,
    protocol: str | None = None,
    input_lens: list[int] | None = None,
    output_lens: list[int] | None = None,
    concurrencies: list[int] | None = None,
    num_prompts: int | None = None,
    request_rate: Any = None,
    seed: int | None = None,
    prefix_ratio: float | None = None,
) -> Settings:
    """The plan's `bench` (profile defaults, with an optional sweep) with the command line on
    top. Sweeps are the cross product input x output x concurrency."""
    sweep = bench.sweep
    proto = protocol or bench.protocol
    if proto not in PROTOCOLS:
        raise BenchError(f"unknown protocol {proto!r}: use one of {', '.join(PROTOCOLS)}.")
    ratio = prefix_ratio if prefix_ratio is not None else bench.prefix_ratio
    if not 0 < ratio < 1:
        raise BenchError(f"prefix ratio must be between 0 and 1 (exclusive), got {ratio}.")
    ins = input_lens or list(sweep.input_len if sweep else ()) or [bench.input_len]
    outs = output_lens or list(sweep.output_len if sweep else ()) or [bench.output_len]
    concs: list[int | None] = []  # None: no concurrency limit
    concs += concurrencies or (sweep.max_concurrency if sweep else ()) or [bench.max_concurrency]
    rate = parse_rate(request_rate if request_rate is not None else bench.request_rate)
    return Settings(
        protocol=proto,
        num_prompts=num_prompts or bench.num_prompts,
        seed=seed if seed is not None else bench.seed,
        ignore_eos=bench.ignore_eos,
        prefix_ratio=ratio,
        points=tuple(Point(i, o, c, rate) for i in ins for o in outs for c in concs),
    )


def check_lengths(settings: Settings, max_model_len: int | None) -> None:
    """Refuse, before anything restarts, points whose prompts vLLM would reject (the UCM
    guide benchmarks 32k prompts against --max-model-len 17000), naming both fixes."""
    if max_model_len is None:
        return
    bad = [p for p in settings.points if p.input_len + p.output_len > max_model_len]
    if bad:
        p = max(bad, key=lambda q: q.input_len + q.output_len)
        raise BenchError(
            f"input {p.input_len} + output {p.output_len} tokens exceed max_model_len "
            f"{max_model_len}: vLLM would reject every request. Either bench what is served "
            f"(--input-len {max(1, max_model_len - p.output_len)}, or --set bench.input_len=...) "
            f"or serve what you bench (--set model.max_model_len={p.input_len + p.output_len}; "
            "it needs the KV memory)."
        )


def resolve_scenarios(
    names: list[str], bench: BenchSpec, connectors: dict[str, list[str]] | None = None
) -> list[Scenario]:
    """CLI `--scenario` values, in order. Each is NAME (from the profile's `bench.scenarios`,
    else a preset) or NAME:field=value[;field=value...] defined inline (no cache check).
    `connectors` (group -> kv_connectors of the profile) is what `without` acts on."""
    defined = bench.scenarios
    out: list[Scenario] = []
    seen: set[str] = set()
    for item in names:
        name, sep, inline = item.partition(":")
        name = name.strip()
        if not name:
            raise BenchError(f"--scenario {item!r}: the scenario needs a name (NAME[:sets]).")
        if name in seen:
            raise BenchError(f"scenario {name!r} is given twice.")
        seen.add(name)
        if sep:
            sets = tuple(s.strip() for s in inline.split(";") if s.strip())
            bad = [s for s in sets if "=" not in s]
            if bad:
                raise BenchError(
                    f"scenario {name!r}: {bad[0]!r} is not field.path=value "
                    "(separate several with ';')."
                )
            spec = ScenarioSpec(sets=sets)
        elif name in defined:
            spec = defined[name]
        elif name in PRESET_SCENARIOS:
            spec = PRESET_SCENARIOS[name]
        else:
            known = sorted(set(defined) | set(PRESET_SCENARIOS))
            raise BenchError(
                f"unknown scenario {name!r}. Known: {', '.join(known)}. Define it in the "
                f"profile under bench.scenarios ({name}: [field.path=value, ...]) or inline "
                f"with --scenario '{name}:field.path=value;...'."
            )
        extra, removed = without_sets(name, connectors or {}, spec.without)
        out.append(Scenario(name, (*spec.sets, *extra), spec.cache, tuple(removed)))
    return out
