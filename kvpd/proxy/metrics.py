"""Proxy counters and latency histograms, rendered as Prometheus text on GET /metrics."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvpd.proxy.apis import GENERATION_PATHS
from kvpd.proxy.backends import CLOSED, HALF_OPEN, OPEN, TRANSITIONS
from kvpd.proxy.cache_aware import render as render_routing

if TYPE_CHECKING:
    from kvpd.proxy.backends import BackendPool
    from kvpd.proxy.server import ServerState

# Writes the HELP and TYPE lines of one metric family.
Family = Callable[[str, str, str], None]

_LATENCY_BOUNDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip

# Failure kinds, fixed so that every series exists (at 0) from the start.
FAILURE_KINDS = (
    "bad_request",
    "no_prefiller",
    "no_decoder",
    "prefill_error",
    "prefill_timeout",
    "prefill_rejected",
    "decode_error",
    "decode_timeout",
    "decode_rejected",
    "stream_truncated",
    "client_disconnect",
    "metaserver_unknown",
    "metaserver_forbidden",
)


class Histogram:
    """Cumulative-on-render histogram: observe() is one bisect and two additions."""

    __slots__ = ("bounds", "counts", "total", "n")

    def __init__(self, bounds: tuple[float, ...] = _LATENCY_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def render(self, name: str, out: list[str]) -> None:
        acc = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            acc += count
            out.append(f'{name}_bucket{{le="{bound:g}"}} {acc}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        out.append(f"{name}_sum {self.total:.6f}")
        out.append(f"{name}_count {self.n}")


class ProxyMetrics:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by kvpd.proxy.apis.GenerationRoute
        self.responses: Counter[int] = Counter()  # by HTTP status sent to the client
        self.failures: Counter[str] = Counter({k: 0 for k in FAILURE_KINDS})
        self.disaggregated = 0  # prefill succeeded and its kv_transfer_params reached decode
        self.prefill_without_params = 0  # prefill succeeded but returned no kv_transfer_params
        self.refused_before_prefill = 0  # sent to a decoder without a prefill (see limits.py)
        self.kv_handoff_tokens = 0  # decoders' cached-token figures beyond the prefills'
        self.retries = 0
        self.inflight = 0
        self.prefill_seconds = Histogram()
        self.first_byte_seconds = Histogram()  # request received -> first decode byte sent
        self.request_seconds = Histogram()  # request received -> response complete

    def render(
        self, prefillers: BackendPool, decoders: BackendPool, server: ServerState | None = None
    ) -> bytes:
        out: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        self._render_counters(family, out)
        if server is not None:
            _render_server(server, family, out)
        pools = (prefillers, decoders)
        _render_backend_states(pools, family, out)
        _render_backend_load(pools, family, out)
        render_routing(pools, family, out)
        self._render_histograms(family, out)
        out.append("")
        return "\n".join(out).encode()

    def _render_counters(self, family: Family, out: list[str]) -> None:
        """The request, response, handoff and failure counters."""
        out.append("# The proxy's own metrics; the engines' are at /metrics/engines, by backend.")
        family("kvpd_proxy_requests_total", "counter", "Generation requests received, by route.")
        for route in GENERATION_PATHS.values():
            out.append(f'kvpd_proxy_requests_total{{route="{route}"}} {self.requests[route]}')
        family("kvpd_proxy_responses_total", "counter", "Generation responses, by HTTP status.")
        for status in sorted(self.responses):
            out.append(f'kvpd_proxy_responses_total{{status="{status}"}} {self.responses[status]}')
        family(
            "kvpd_proxy_disaggregated_requests_total",
            "counter",
            "Requests whose prefill succeeded and whose kv_transfer_params reached a decoder.",
        )
        out.append(f"kvpd_proxy_disaggregated_requests_total {self.disaggregated}")
        family(
            "kvpd_proxy_prefill_without_kv_params_total",
            "counter",
            "Prefills that succeeded without returning kv_transfer_params (e.g. ExampleConnector).",
        )
        out.append(f"kvpd_proxy_prefill_without_kv_params_total {self.prefill_without_params}")
        family(
            "kvpd_proxy_sent_without_prefill_total",
            "counter",
            "Requests the decoder would surely refuse for their output limit, sent to it "
            "without a prefill (it answers the engine's own 400).",
        )
        out.append(f"kvpd_proxy_sent_without_prefill_total {self.refused_before_prefill}")
        family(
            "kvpd_proxy_kv_handoff_tokens_total",
            "counter",
            "Prompt tokens decoders reported as cached beyond the prefill's prefix-cache hits "
            "(the KV handed over; clients see the prefill's figure as cached_tokens).",
        )
        out.append(f"kvpd_proxy_kv_handoff_tokens_total {self.kv_handoff_tokens}")
        family("kvpd_proxy_failures_total", "counter", "Failed requests, by kind.")
        for kind in sorted(self.failures):
            out.append(f'kvpd_proxy_failures_total{{kind="{kind}"}} {self.failures[kind]}')
        family("kvpd_proxy_retries_total", "counter", "Backend attempts repeated after an error.")
        out.append(f"kvpd_proxy_retries_total {self.retries}")
        family("kvpd_proxy_inflight_requests", "gauge", "Client requests being served.")
        out.append(f"kvpd_proxy_inflight_requests {self.inflight}")

    def _render_histograms(self, family: Family, out: list[str]) -> None:
        """The prefill, first-byte and request latency histograms."""
        for name, hist, help_text in (
            ("kvpd_proxy_prefill_seconds", self.prefill_seconds, "Prefill round trip."),
            (
                "kvpd_proxy_first_byte_seconds",
                self.first_byte_seconds,
                "From request received to the first decoder byte sent to the client.",
            ),
            ("kvpd_proxy_request_seconds", self.request_seconds, "Whole request duration."),
        ):
            family(name, "histogram", help_text)
            hist.render(name, out)


def _render_server(server: ServerState, family: Family, out: list[str]) -> None:
    """The client connections' gauges and refusal counters."""
    family("kvpd_proxy_client_connections", "gauge", "Open client connections.")
    out.append(f"kvpd_proxy_client_connections {len(server.connections)}")
    family("kvpd_proxy_connections_refused_total", "counter",
           "Client connections answered 503 because of --max-connections or "
           "--max-connections-per-peer.")  # fmt: skip
    out.append(f"kvpd_proxy_connections_refused_total {server.refused}")
    family("kvpd_proxy_unauthorized_total", "counter",
           "Client requests answered 401 (no or a wrong client key).")  # fmt: skip
    refused = server.gate.refused if server.gate is not None else 0
    out.append(f"kvpd_proxy_unauthorized_total {refused}")
    family("kvpd_proxy_connections_timed_out_total", "counter",
           "Client connections closed for stalling or idling (--client-timeout, "
           "--idle-timeout).")  # fmt: skip
    out.append(f"kvpd_proxy_connections_timed_out_total {server.timed_out}")


def _render_backend_states(pools: tuple[BackendPool, ...], family: Family, out: list[str]) -> None:
    """Each backend's circuit, transitions and drain."""
    family("kvpd_proxy_backend_circuit", "gauge",
           "Circuit breaker state per backend (1 for the current state).")  # fmt: skip
    for pool in pools:
        for b in pool.backends:
            for state in (CLOSED, OPEN, HALF_OPEN):
                out.append(f'kvpd_proxy_backend_circuit{{role="{pool.role}",'
                           f'backend="{b.name}",state="{state}"}} '
                           f"{int(b.circuit == state)}")  # fmt: skip
    family("kvpd_proxy_backend_transitions_total", "counter",
           "Backend state changes: health, circuit breaker, drain.")  # fmt: skip
    for pool in pools:
        for b in pool.backends:
            for to in TRANSITIONS:
                out.append(f'kvpd_proxy_backend_transitions_total{{role="{pool.role}",'
                           f'backend="{b.name}",to="{to}"}} {b.transitions[to]}')  # fmt: skip
    family("kvpd_proxy_backend_draining", "gauge", "1 while the admin drains the backend.")
    for pool in pools:
        for b in pool.backends:
            out.append(f'kvpd_proxy_backend_draining{{role="{pool.role}",'
                       f'backend="{b.name}"}} {int(b.draining)}')  # fmt: skip


def _render_backend_load(pools: tuple[BackendPool, ...], family: Family, out: list[str]) -> None:
    """Each backend's in-flight work, health and request counts."""
    for name, kind, help_text, attr in (
        ("kvpd_proxy_backend_inflight", "gauge", "Requests in flight per backend.", "inflight"),
        (
            "kvpd_proxy_backend_outstanding_tokens",
            "gauge",
            "Estimated tokens of work in flight per backend.",
            "outstanding",
        ),
        (
            "kvpd_proxy_backend_healthy",
            "gauge",
            "1 if the backend is healthy, its circuit not open and not draining.",
            "healthy_num",
        ),
        ("kvpd_proxy_backend_requests_total", "counter", "Requests sent.", "requests"),
        ("kvpd_proxy_backend_errors_total", "counter", "Failed requests.", "errors"),
    ):
        family(name, kind, help_text)
        for pool in pools:
            for b in pool.backends:
                out.append(f'{name}{{role="{pool.role}",backend="{b.name}"}} {getattr(b, attr)}')
