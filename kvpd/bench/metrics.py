"""Prometheus /metrics of the engines and the proxy: parse, scrape, and the deltas of a phase."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvpd.exec.http_wire import endpoint
from kvpd.exec.transport import ChannelError, Transport, Transports
from kvpd.plan.value import Plan
from kvpd.profile.roles import ENGINE_ROLES, PREFILLING_ROLES, Role

# A sample line: name{label="value",...} value [timestamp]. Label values may hold escaped quotes.
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


Labels = tuple[tuple[str, str], ...]
Samples = dict[str, dict[Labels, float]]


def parse(text: str) -> Samples:
    """Prometheus text format -> {metric name: {sorted label pairs: value}}. Comments, blank and
    malformed lines are skipped (a scrape must never fail a benchmark on one odd line)."""
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, _, labels_text, raw = m.group(1), m.group(2), m.group(3), m.group(4)
        try:
            value = float(raw)
        except ValueError:
            continue
        labels: Labels = ()
        if labels_text:
            pairs = [(k, _unescape(v)) for k, v in _LABEL.findall(labels_text)]
            labels = tuple(sorted(pairs))
        out.setdefault(name, {})[labels] = value
    return out


def _unescape(v: str) -> str:
    return v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of a metric's series whose labels include `match` (0.0 when absent)."""
    acc = 0.0
    for labels, value in samples.get(name, {}).items():
        d = dict(labels)
        if all(d.get(k) == v for k, v in match.items()):
            acc += value
    return acc


def has(samples: Samples, name: str) -> bool:
    return name in samples


@dataclass(frozen=True)
class Target:
    """One /metrics endpoint of the deployment."""

    name: str  # process name, e.g. decode-0, proxy
    role: Role  # an engine role or the proxy
    url: str  # as seen from `host`, whose transport carries the scrape
    host: str = ""


def targets(plan: Plan) -> list[Target]:
    """Engines and the proxy, their /metrics next to their health URL (same host and port)."""
    out = []
    for p in plan.processes:
        if p.role not in (*ENGINE_ROLES, Role.PROXY) or p.health is None:
            continue
        base = p.health.url.split("://", 1)
        scheme, rest = (base[0], base[1]) if len(base) == 2 else ("http", base[0])
        hostport = rest.split("/", 1)[0]
        out.append(Target(p.name, p.role, f"{scheme}://{hostport}/metrics", p.host))
    return out


@dataclass
class Snapshot:
    """Parsed /metrics per target; `errors` holds the targets that could not be scraped."""

    samples: dict[str, Samples] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def fetch(t: Transport, url: str, timeout_s: float = 10.0) -> str:
    """GET `url` from `t`'s host; raises ChannelError, or ValueError for a bad URL/status."""
    resp = t.http(endpoint(url).request(timeout_s=timeout_s))
    if resp.status != 200:
        raise ValueError(f"HTTP {resp.status}")
    return resp.body.decode("utf-8", "replace")


def scrape(tgts: list[Target], transports: Transports, timeout_s: float = 10.0) -> Snapshot:
    """Scrape every target in parallel (before/after a phase: as close together as possible),
    each through its host's transport."""
    snap = Snapshot()

    def one(t: Target) -> tuple[Target, str | None, str]:
        try:
            return t, fetch(transports[t.host], t.url, timeout_s), ""
        except ChannelError as e:
            return t, None, e.detail
        except (KeyError, ValueError) as e:
            return t, None, str(e)

    if not tgts:
        return snap
    with ThreadPoolExecutor(max_workers=min(16, len(tgts))) as pool:
        for t, text, err in pool.map(one, tgts):
            if text is None:
                snap.errors[t.name] = err
            else:
                snap.samples[t.name] = parse(text)
    return snap


# What a phase did, per engine: counter deltas. Names from vLLM 0.32 (cpu-engine.md §4.6).
_ENGINE_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "requests": ("vllm:request_success_total", {}),
    "prompt_tokens": ("vllm:prompt_tokens_total", {}),
    "generation_tokens": ("vllm:generation_tokens_total", {}),
    "local_compute_tokens": ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
    "local_cache_hit_tokens": (
        "vllm:prompt_tokens_by_source_total",
        {"source": "local_cache_hit"},
    ),
    "kv_received_tokens": (
        "vllm:prompt_tokens_by_source_total",
        {"source": "external_kv_transfer"},
    ),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", {}),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", {}),
    "external_prefix_cache_queries": ("vllm:external_prefix_cache_queries_total", {}),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits_total", {}),
}
_PROXY_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "requests": ("kvpd_proxy_requests_total", {}),
    "disaggregated": ("kvpd_proxy_disaggregated_requests_total", {}),
    "prefill_without_kv_params": ("kvpd_proxy_prefill_without_kv_params_total", {}),
    "failures": ("kvpd_proxy_failures_total", {}),
}


@dataclass
class Delta:
    """Counter increases during one phase, per target and summed per role."""

    per_target: dict[str, dict[str, float]] = field(default_factory=dict)
    roles: dict[str, Role] = field(default_factory=dict)  # target name -> role
    missing: dict[str, str] = field(default_factory=dict)  # target -> why it has no delta

    def role_sum(self, role: Role, key: str) -> float:
        return sum(v.get(key, 0.0) for n, v in self.per_target.items() if self.roles[n] == role)

    def engines_sum(self, key: str) -> float:
        return sum(self.role_sum(r, key) for r in ENGINE_ROLES)

    def has_role(self, role: Role) -> bool:
        return any(r == role for r in self.roles.values())

    def summary(self) -> dict[str, Any]:
        """The numbers the report shows as proof of disaggregation and caching."""
        s: dict[str, Any] = {}
        for role in ENGINE_ROLES:
            if self.has_role(role):
                s[f"{role}_requests"] = self.role_sum(role, "requests")
        if self.has_role(Role.DECODE):
            s["decode_kv_received_tokens"] = self.role_sum(Role.DECODE, "kv_received_tokens")
            s["decode_cached_tokens"] = self.role_sum(Role.DECODE, "local_cache_hit_tokens")
            s["decode_computed_tokens"] = self.role_sum(Role.DECODE, "local_compute_tokens")
        s["prefix_cache_hits"] = self.engines_sum("prefix_cache_hits")
        # The guide's HBM figure: of the prompt tokens the prefilling engines (prefill, else
        # mixed) looked up in their own prefix cache, the share they found there.
        where = next((r for r in PREFILLING_ROLES if self.has_role(r)), None)
        if where is not None:
            looked_up = self.role_sum(where, "prefix_cache_queries")
            hits = self.role_sum(where, "prefix_cache_hits")
            s["prefix_hit_ratio"] = hits / looked_up if looked_up else None
        s["prefix_cache_queries"] = self.engines_sum("prefix_cache_queries")
        s["external_prefix_cache_hits"] = self.engines_sum("external_prefix_cache_hits")
        s["external_prefix_cache_queries"] = self.engines_sum("external_prefix_cache_queries")
        s["local_cache_hit_tokens"] = self.engines_sum("local_cache_hit_tokens")
        s["prompt_tokens"] = self.engines_sum("prompt_tokens")
        if self.has_role(Role.PROXY):
            s["proxy_requests"] = self.role_sum(Role.PROXY, "requests")
            s["proxy_disaggregated"] = self.role_sum(Role.PROXY, "disaggregated")
            # prefill-first handoffs: with kv_transfer_params (NIXL, Mooncake) or without
            # (ExampleConnector, shared storage)
            s["proxy_handoffs"] = s["proxy_disaggregated"] + self.role_sum(
                Role.PROXY, "prefill_without_kv_params"
            )
            s["proxy_failures"] = self.role_sum(Role.PROXY, "failures")
        return s

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "per_target": self.per_target,
            "roles": self.roles,
            "missing": self.missing,
        }


def delta(tgts: list[Target], before: Snapshot, after: Snapshot) -> Delta:
    d = Delta()
    for t in tgts:
        d.roles[t.name] = t.role
        if t.name not in before.samples or t.name not in after.samples:
            why = before.errors.get(t.name) or after.errors.get(t.name) or "not scraped"
            d.missing[t.name] = f"{t.url}: {why}"
            continue
        counters = _PROXY_COUNTERS if t.role == Role.PROXY else _ENGINE_COUNTERS
        b, a = before.samples[t.name], after.samples[t.name]
        row: dict[str, float] = {}
        for key, (name, match) in counters.items():
            if has(a, name):
                # A restarted process resets its counters: never report a negative delta.
                row[key] = max(0.0, total(a, name, **match) - total(b, name, **match))
        d.per_target[t.name] = row
    return d
