"""What a bench run does: protocol, sweep points and scenarios, from the plan and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpd.errors import BenchError

PROTOCOLS = ("plain", "prefix", "twice")
# Scenarios every profile has. `external` depends on the profile's KV store, so a profile that
# wants it defines it under `bench.scenarios` (e.g. the connector to switch on).
PRESET_SCENARIOS: dict[str, tuple[str, ...]] = {
    "recompute": ("engine.enable_prefix_caching=false",),
    "hbm": ("engine.enable_prefix_caching=true",),
    "as-is": (),
}


def expects_external(name: str) -> bool:
    """Scenarios named `external...` or `ucm...` must show external prefix-cache hits."""
    n = name.lower()
    return n.startswith("external") or n.startswith("ucm")


@dataclass(frozen=True)
class Scenario:
    name: str
    sets: tuple[str, ...] = ()

    @property
    def expect_external(self) -> bool:
        return expects_external(self.name)


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


@dataclass
class Settings:
    protocol: str = "plain"
    num_prompts: int = 10
    seed: int = 123456
    ignore_eos: bool = True
    prefix_ratio: float = 0.8
    points: list[Point] = field(default_factory=list)


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


def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


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
    bench: dict[str, Any],
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
    """The plan's `bench` (profile defaults, with an optional `sweep` mapping of lists) with
    the command line on top. Sweeps are the cross product input x output x concurrency."""
    sweep = bench.get("sweep") or {}
    proto = protocol or bench.get("protocol") or "plain"
    if proto not in PROTOCOLS:
        raise BenchError(f"unknown protocol {proto!r}: use one of {', '.join(PROTOCOLS)}.")
    ratio = prefix_ratio if prefix_ratio is not None else float(bench.get("prefix_ratio", 0.8))
    if not 0 < ratio < 1:
        raise BenchError(f"prefix ratio must be between 0 and 1 (exclusive), got {ratio}.")
    ins = input_lens or _as_list(sweep.get("input_len")) or [int(bench.get("input_len", 1024))]
    outs = output_lens or _as_list(sweep.get("output_len")) or [int(bench.get("output_len", 128))]
    concs: list[int | None] = list(
        concurrencies or _as_list(sweep.get("max_concurrency")) or [bench.get("max_concurrency")]
    )
    rate = parse_rate(request_rate if request_rate is not None else bench.get("request_rate"))
    points = [Point(int(i), int(o), c, rate) for i in ins for o in outs for c in concs]
    return Settings(
        protocol=proto,
        num_prompts=num_prompts or int(bench.get("num_prompts", 10)),
        seed=seed if seed is not None else int(bench.get("seed", 123456)),
        ignore_eos=bool(bench.get("ignore_eos", True)),
        prefix_ratio=ratio,
        points=points,
    )


def resolve_scenarios(names: list[str], bench: dict[str, Any]) -> list[Scenario]:
    """CLI `--scenario` values, in order. Each is NAME (from the profile's `bench.scenarios`,
    else a preset) or NAME:field=value[;field=value...] defined inline."""
    defined: dict[str, list[str]] = {
        str(k): [str(s) for s in _as_list(v)] for k, v in (bench.get("scenarios") or {}).items()
    }
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
        elif name in defined:
            sets = tuple(defined[name])
        elif name in PRESET_SCENARIOS:
            sets = PRESET_SCENARIOS[name]
        else:
            known = sorted(set(defined) | set(PRESET_SCENARIOS))
            raise BenchError(
                f"unknown scenario {name!r}. Known: {', '.join(known)}. Define it in the "
                f"profile under bench.scenarios ({name}: [field.path=value, ...]) or inline "
                f"with --scenario '{name}:field.path=value;...'."
            )
        out.append(Scenario(name, sets))
    return out
