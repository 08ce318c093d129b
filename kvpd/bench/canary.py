"""The canary: one short real request through the proxy, proven from /metrics deltas.

`kvpd up` ends with it and `kvpd restart` runs it after each process comes back. Whether
disaggregation happened is decided by `kvpd.bench.proof` (the same code that fails a benchmark),
so a canary and a bench run cannot disagree about what "P/D works" means.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from kvpd.bench import metrics, output_check, outputs, proof
from kvpd.errors import DeployError
from kvpd.exec import client_key
from kvpd.exec.http_wire import endpoint
from kvpd.exec.transport import ChannelError, Transport, Transports
from kvpd.plan.value import Plan
from kvpd.profile.roles import ENGINE_ROLES, Role

# Long enough to span several KV blocks of any engine (block sizes 16..128 tokens).
_TEXT = (
    "The operators of a disaggregated serving cluster want to know right after start that "
    "prefill hands its key value cache to decode, not after a benchmark an hour later. "
)


@dataclass
class CanaryResult:
    """What the canary saw. `ok`: every check passed; `line`: the one line to print."""

    ok: bool
    line: str
    problems: list[str] = field(default_factory=list)
    delta: dict[str, Any] = field(default_factory=dict)
    requests: int = 0
    outputs: dict[str, Any] = field(default_factory=dict)  # OutputReport.to_dict(); {}: off

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "line": self.line, "problems": self.problems,
                "requests": self.requests, "delta": self.delta,
                "outputs": self.outputs}  # fmt: skip


def prompt(blocks: int = 4) -> str:
    """A prompt no engine has cached (a fresh nonce first), so decode cannot skip the
    handover by finding it in its own prefix cache."""
    return f"canary {secrets.token_hex(6)}: " + _TEXT * blocks


def send(
    t: Transport,
    base_url: str,
    model: str,
    text: str,
    *,
    max_tokens: int = 4,
    timeout_s: float = 120.0,
    key: str = "",
) -> int:
    """POST one completion from `t`'s host (with the proxy's client `key`, if any); the number
    of generated tokens (raises ChannelError, or ValueError for an error status or an answer
    that is not JSON)."""
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0}
    out = complete(t, base_url, body, timeout_s=timeout_s, key=key)
    usage = out.get("usage") or {}
    tokens = int(usage.get("completion_tokens") or 0)
    if not tokens and any(c.get("text") for c in out.get("choices") or []):
        tokens = 1
    return tokens


def complete(
    t: Transport, base_url: str, body: dict[str, Any], *, timeout_s: float = 120.0, key: str = ""
) -> dict[str, Any]:
    """POST `body` to `base_url`/v1/completions through `t` (the transport of the host the URL
    is on), with the proxy's client `key` if any; the JSON answer. Every request of the canary
    and of the output check goes through here. Raises ChannelError, or ValueError for an error
    status or an answer that is not a JSON object."""
    headers = [("Content-Type", "application/json")]
    if key:
        headers.append(("Authorization", f"Bearer {key}"))
    req = endpoint(base_url, "/v1/completions").request(
        "POST", body=json.dumps(body).encode(), headers=tuple(headers), timeout_s=timeout_s
    )
    resp = t.http(req)
    if resp.status != 200:
        raise ValueError(f"HTTP {resp.status} {resp.body.decode('utf-8', 'replace')[:300]}")
    out = json.loads(resp.body or b"{}")
    if not isinstance(out, dict):
        raise ValueError("the answer is not a JSON object")
    return out


def poster(plan: Plan, transports: Transports, key: str) -> output_check.Post:
    """The output check's HTTP for `plan`: the proxy's URL through the proxy host's transport
    with the client key; the reference engine's through its own host's, without the key (it is
    the proxy's)."""
    ref = output_check.reference_process(plan)

    def post(url: str, body: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        if url == plan.proxy_url:
            return complete(transports[plan.proxy_host], url, body, timeout_s=timeout_s, key=key)
        host = ref.host if ref is not None else plan.proxy_host
        return complete(transports[host], url, body, timeout_s=timeout_s)

    return post


def applies(plan: Plan) -> bool:
    """A canary needs engines with /metrics and a URL to send to (a plan of services only,
    e.g. a KV store under test, has nothing to prove)."""
    engines = [t for t in metrics.targets(plan) if t.role in ENGINE_ROLES]
    return bool(engines and plan.proxy_url)


def run(
    plan: Plan,
    transports: Transports,
    *,
    timeout_s: float = 120.0,
    verify_outputs: bool = True,
    live_traffic: bool = False,
) -> CanaryResult:
    """Scrape, send (one request, or one per mixed instance), scrape, judge; then, unless
    `verify_outputs` is off, the output check (kvpd.bench.output_check; `live_traffic`: other
    requests may share its batches, so it compares within a tolerance). Every exchange goes
    through the transport of the host it goes to."""
    tgts = metrics.targets(plan)
    roles = {t.role for t in tgts}
    disaggregated = Role.PREFILL in roles and Role.DECODE in roles
    n = 1 if disaggregated else max(1, sum(1 for t in tgts if t.role == Role.MIXED))
    if not plan.proxy_url:
        return CanaryResult(False, "canary: the plan has no proxy/serving URL to send to.",
                            ["no proxy URL"])  # fmt: skip
    try:
        key = client_key.read(plan)
    except DeployError as e:
        return CanaryResult(False, f"canary: {e}", [str(e)])
    before = metrics.scrape(tgts, transports, timeout_s=10)
    generated, errors = 0, []
    for _ in range(n):
        try:
            t = transports[plan.proxy_host]
            generated += send(
                t, plan.proxy_url, plan.served_model, prompt(), timeout_s=timeout_s, key=key
            )
        except ChannelError as e:
            errors.append(f"POST {plan.proxy_url}/v1/completions failed: {e.detail}")
        except (KeyError, ValueError) as e:
            errors.append(f"POST {plan.proxy_url}/v1/completions failed: {e}")
    after = metrics.scrape(tgts, transports, timeout_s=10)
    d = metrics.delta(tgts, before, after)
    result = judge(d, requests=n, generated=generated, errors=errors,
                   disaggregated=disaggregated, layerwise=layerwise(plan))  # fmt: skip
    if not verify_outputs or errors:
        return result

    post = poster(plan, transports, key)
    report = output_check.run(
        plan, post, prompt, transports, timeout_s=timeout_s, live=live_traffic
    )
    return with_outputs(result, report)


def with_outputs(result: CanaryResult, report: outputs.OutputReport) -> CanaryResult:
    """The canary's verdict with the output check's: both must pass. A failed output check
    says whether the /metrics proof passed, since that is what it catches that /metrics
    cannot."""
    summary = report.summary()
    problems = list(result.problems) + report.problems("canary")
    if not problems:
        return CanaryResult(True, f"{result.line}; {summary}", [], result.delta,
                            result.requests, report.to_dict())  # fmt: skip
    if not result.ok:
        return CanaryResult(False, result.line, problems, result.delta, result.requests,
                            report.to_dict())  # fmt: skip
    problems.append(f"the /metrics proof passed ({result.line}); only the output check sees this")
    line = f"canary FAILED: {summary}. {problems[0]}"
    return CanaryResult(False, line, problems, result.delta, result.requests, report.to_dict())


def layerwise(plan: Plan) -> bool:
    """The proxy runs the decode-first flow, where the decoder calls its /v1/metaserver."""
    return any(p.role == Role.PROXY and "layerwise" in p.command for p in plan.processes)


def judge(
    d: metrics.Delta,
    *,
    requests: int,
    generated: int,
    errors: list[str],
    disaggregated: bool,
    layerwise: bool = False,
) -> CanaryResult:
    """The verdict on one canary's deltas (pure: tested without engines)."""
    where = "canary"
    problems = list(errors)
    if not errors and generated <= 0:
        problems.append(f"{where}: the proxy answered but no tokens came back.")
    if disaggregated:
        problems += proof.prefill_problems(where, d)
        problems += proof.handoff_problems(where, d)
        if layerwise and d.has_role(Role.PROXY) and d.role_sum(Role.PROXY, "disaggregated") <= 0:
            problems.append(
                f"{where}: kvpd_proxy_disaggregated_requests_total of the proxy did not move: "
                "no decoder called the proxy's /v1/metaserver, so the layerwise (decode-first) "
                "path was not used. Check the decoders' kv_transfer_config (metaserver URL) "
                "and `kvpd logs proxy`."
            )
    else:
        served = d.role_sum(Role.MIXED, "requests")
        if served < requests:
            names = ", ".join(n for n, r in d.roles.items() if r == Role.MIXED)
            problems.append(
                f"{where}: vllm:request_success_total grew by {served:.0f} on {names} for "
                f"{requests} requests sent through the proxy."
            )
    summary = d.to_dict()
    if problems:
        return CanaryResult(False, "canary FAILED: " + problems[0], problems, summary, requests)
    if not disaggregated:
        return CanaryResult(True, f"Canary: {requests} request(s) served, {generated} tokens back",
                            [], summary, requests)  # fmt: skip
    src = _top(d, Role.PREFILL, "requests")
    dst = _top(d, Role.DECODE, "kv_received_tokens") or _top(d, Role.DECODE, "requests")
    received = d.role_sum(Role.DECODE, "kv_received_tokens")
    line = f"P→D KV handover verified: {received:.0f} tokens from {src} to {dst}"
    return CanaryResult(True, line, [], summary, requests)


def _top(d: metrics.Delta, role: Role, key: str) -> str:
    best = [(v.get(key, 0.0), n) for n, v in d.per_target.items() if d.roles[n] == role]
    best = [b for b in best if b[0] > 0]
    return max(best)[1] if best else ""
