"""Proof of disaggregation and caching: the checks that turn a run into a failure."""

from __future__ import annotations

from typing import Any

from kvpd.bench.metrics import Delta
from kvpd.profile.bench_schema import CacheCheck
from kvpd.profile.roles import ENGINE_ROLES, PREFILLING_ROLES, Role


def check_phase(
    *,
    scenario: str,
    phase: str,
    measured: bool,
    protocol: str,
    disaggregated: bool,
    cache: CacheCheck | None,
    result: dict[str, Any],
    delta: Delta,
    prefix_ratio: float = 0.8,
    input_len: int = 0,
) -> list[str]:
    """Problems that make this phase's numbers not a result (empty list: it is one).

    - Failed requests, or none completed.
    - P/D (every phase, seeding included): decode received no KV (its
      `prompt_tokens_by_source{source="external_kv_transfer"}` did not grow) and computed more
      prompt tokens itself than it found in its own prefix cache. Decode then recomputed the
      prompts: the P->D handoff does not work. (Decode may legitimately receive nothing when
      its own prefix cache already holds the prompts, e.g. the measured phase of the prefix
      protocol; the seeding phase before it is where the transfer must show.)
    - The scenario's cache, whatever the scenario is called: `external` must hit the external
      KV store in the phase whose prompts were seeded before (prefix: measured; twice: warm);
      `none` (recompute) must show zero vLLM prefix-cache and zero external hits and `hbm` zero
      external hits, in every phase. In a P/D deployment decode's external hits are the P->D
      handoff, so only prefill (and mixed) engines count as external hits.
    - The cache state the protocol assumes (`hit_ratio_problems`), whatever the scenario.
    """
    problems: list[str] = []
    where = f"scenario {scenario!r}, phase {phase}"
    completed = int(result.get("completed") or 0)
    failed = int(result.get("failed") or 0)
    if failed:
        problems.append(f"{where}: {failed} of {completed + failed} requests failed.")
    if completed == 0:
        problems.append(f"{where}: no request completed.")
        return problems
    if disaggregated:
        problems += handoff_problems(where, delta)
    ext_roles = PREFILLING_ROLES if disaggregated else ENGINE_ROLES
    problems += hit_ratio_problems(
        where, protocol, phase, prefix_ratio, delta, ext_roles, input_len
    )
    seeded_phase = (protocol == "prefix" and phase == "measured") or (
        protocol == "twice" and phase == "warm"
    )
    if cache is None:
        return problems
    engines = [n for n, r in delta.roles.items() if r in ENGINE_ROLES]
    if engines and all(n in delta.missing for n in engines):
        if cache != "external" or (seeded_phase and measured):
            problems.append(f"{where}: cannot check the {cache} cache: no engine /metrics.")
        return problems
    external = sum(delta.role_sum(r, "external_prefix_cache_hits") for r in ext_roles)
    if cache == "external" and seeded_phase and measured and external <= 0:
        problems.append(
            f"{where}: zero external prefix-cache hits (vllm:external_prefix_cache_hits_total "
            f"of the {'/'.join(ext_roles)} engines did not grow) although this phase repeats "
            "seeded prompts: the external KV store is not used. Check the scenario's "
            "connector settings and the store's logs."
        )
    if cache in ("none", "hbm") and external > 0:
        problems.append(
            f"{where}: {external:.0f} external prefix-cache hits on the "
            f"{'/'.join(ext_roles)} engines in a scenario without an external KV store "
            f"(cache: {cache}): a store is still attached, so this is not the guide's "
            f"{'recompute' if cache == 'none' else 'HBM prefix cache'} row. Check the "
            "scenario's `without` list."
        )
    hbm = delta.engines_sum("prefix_cache_hits")
    if cache == "none" and hbm > 0:
        problems.append(
            f"{where}: {hbm:.0f} vLLM prefix-cache hits (vllm:prefix_cache_hits_total) in a "
            "recompute scenario (cache: none): prefix caching is still on somewhere. Set "
            "enable_prefix_caching=false on every group in the scenario's sets."
        )
    return problems


def handoff_problems(where: str, delta: Delta) -> list[str]:
    """THE definition of "disaggregation happened" (bench and `up`'s canary alike): the decode
    engines served requests and either received KV or computed no more prompt tokens than
    they found in their own prefix cache. Empty list: it happened."""
    decode_missing = {n: w for n, w in delta.missing.items() if delta.roles[n] == Role.DECODE}
    if decode_missing:
        return [
            f"{where}: cannot prove disaggregation, decode /metrics unreachable: "
            + "; ".join(f"{n} ({w})" for n, w in decode_missing.items())
        ]
    served = int(delta.role_sum(Role.DECODE, "requests"))
    if served == 0:
        return [
            f"{where}: the decode engines served no request during this phase (their "
            "vllm:request_success_total did not grow): the proxy is not sending requests "
            "through decode, so this is not a P/D result."
        ]
    received = delta.role_sum(Role.DECODE, "kv_received_tokens")
    computed = delta.role_sum(Role.DECODE, "local_compute_tokens")
    cached = delta.role_sum(Role.DECODE, "local_cache_hit_tokens")
    if received > 0 or computed <= cached:
        return []
    return [
        f"{where}: decode received no KV: vllm:prompt_tokens_by_source_total"
        f'{{source="external_kv_transfer"}} on the decode engines did not grow while they '
        f"served {served} requests and computed {computed:.0f} prompt tokens themselves "
        f"({cached:.0f} from their own prefix cache), so this is not a P/D result. Check the "
        "KV connector settings of prefill and decode, that prompts are longer than one KV "
        "block, and `kvpd logs decode-0`."
    ]


def prefill_problems(where: str, delta: Delta) -> list[str]:
    """The prefill engines counted the requests the proxy sent them (empty list: they did)."""
    names = [n for n, r in delta.roles.items() if r == Role.PREFILL]
    if not names:
        return []
    missing = [n for n in names if n in delta.missing]
    if len(missing) == len(names):
        return [f"{where}: cannot check prefill, /metrics unreachable: " + ", ".join(missing)]
    if delta.role_sum(Role.PREFILL, "requests") > 0:
        return []
    return [
        f"{where}: vllm:request_success_total did not move on {', '.join(names)}: the proxy "
        "did not send the request to a prefiller first (check the proxy's flow and its log)."
    ]


# The prefix protocol's measured prompts repeat `prefix_ratio` of each prompt; a phase whose
# prompts no earlier phase of this run sent (plain, seeding, cold) should find next to
# nothing cached. Halfway between what the protocol gives and a full hit is contamination; a
# cold phase may find a little (the captured P/D run: 96 of 2043 tokens, 5%). `vllm bench serve`
# first sends the dataset's first prompt as a test request (again while its ready check retries),
# so that prompt hits in the run itself: up to WARMUP_PROMPTS prompts' worth is allowed on top.
COLD_MAX = 0.25
WARMUP_PROMPTS = 2
COLD_PHASES = {("plain", "run"), ("prefix", "seed"), ("twice", "cold")}


def hit_counts(delta: Delta, roles: tuple[Role, ...]) -> tuple[float, float] | None:
    """(prefix-cache hits + external hits, prompt tokens queried) on the engines of `roles`
    that compute prompts (None when they queried nothing or cannot be read)."""
    names = [n for n, r in delta.roles.items() if r in roles]
    if not names or any(n in delta.missing for n in names):
        return None
    queries = sum(delta.role_sum(r, "prefix_cache_queries") for r in roles)
    if queries <= 0:  # prefix caching off: the connector's queries are every prompt token
        queries = sum(delta.role_sum(r, "external_prefix_cache_queries") for r in roles)
    if queries <= 0:
        return None
    hits = sum(
        delta.role_sum(r, "prefix_cache_hits") + delta.role_sum(r, "external_prefix_cache_hits")
        for r in roles
    )
    return hits, queries


def hit_ratio_problems(
    where: str, protocol: str, phase: str, prefix_ratio: float, delta: Delta,
    roles: tuple[Role, ...], input_len: int = 0,
) -> list[str]:  # fmt: skip
    """A phase that found more of its prompts cached than its protocol allows: the caches held
    this run's prompts before it started (an earlier run or scenario), so its numbers are not
    the protocol's."""
    counts = hit_counts(delta, roles)
    if counts is None:
        return []
    hits, queries = counts
    if (protocol, phase) in COLD_PHASES:
        limit, expect = COLD_MAX, "none (its prompts were never sent before)"
        warmup: float = WARMUP_PROMPTS * input_len
    elif (protocol, phase) == ("prefix", "measured"):
        limit = prefix_ratio + (1 - prefix_ratio) / 2
        expect = f"about {prefix_ratio:g} (the seeded prefix)"
        warmup = WARMUP_PROMPTS * input_len * (1 - prefix_ratio)
    else:
        return []
    ratio = hits / queries
    if hits <= limit * queries + warmup:
        return []
    return [
        f"{where}: {ratio:.0%} of the prompt tokens on the {'/'.join(roles)} engines were "
        f"cached (vLLM prefix cache + external store) where the {protocol} protocol expects "
        f"{expect}: the caches held these prompts before the phase began (an earlier run or "
        "scenario), so the numbers are contaminated. Benchmark with fresh prompts (kvpd "
        "bench derives a new seed per run and scenario) or restart the deployment and empty "
        "its KV store."
    ]
