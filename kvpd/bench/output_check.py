"""The output check: a few greedy completions through the proxy (the P/D path) and straight to
a reference engine without disaggregation (a prefill or mixed instance, no
`kv_transfer_params`), compared by kvpd.bench.outputs.

Each prompt goes to the reference first: it computes the prompt from scratch (a fresh nonce,
nothing cached), and with a store connector it also writes the blocks decode then loads, so
decode's copy of the KV is exactly what the reference computed. Then the prompt goes through
the proxy, bracketed by /metrics scrapes, which name the prefill and decode processes that
served it. The requests go one at a time: nothing of the check's is batched together (live
traffic during a rolling restart may be, hence its tolerance).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvpd.bench import metrics, outputs
from kvpd.errors import TransportError
from kvpd.exec.transport import Transports
from kvpd.plan.value import Plan, ProcessSpec
from kvpd.profile.roles import ENGINE_ROLES, Role

PROMPTS = 4
TOKENS = 16
TOP_LOGPROBS = 5
SEED = 0
# (base_url, body, timeout_s) -> JSON answer; kvpd.bench.canary.complete
Post = Callable[..., dict[str, Any]]
Prompt = Callable[[], str]


def reference_process(plan: Plan) -> ProcessSpec | None:
    """The engine that answers alone: the first prefill instance, else the first mixed one."""
    for role in (Role.PREFILL, Role.MIXED):
        for p in plan.processes:
            if p.role == role and p.health is not None:
                return p
    return None


def base_url(p: ProcessSpec) -> str:
    """scheme://host:port of a process, from its health URL."""
    assert p.health is not None
    scheme, _, rest = p.health.url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def tp_of(p: ProcessSpec) -> int:
    """The process's --tensor-parallel-size (1 when its command line has none)."""
    cmd = list(p.command)
    for i, a in enumerate(cmd):
        if a in ("--tensor-parallel-size", "-tp") and i + 1 < len(cmd) and cmd[i + 1].isdigit():
            return int(cmd[i + 1])
        if a.startswith("--tensor-parallel-size=") and a.split("=", 1)[1].isdigit():
            return int(a.split("=", 1)[1])
    return 1


def expectation_for(plan: Plan, ref: ProcessSpec, *, live: bool = False) -> outputs.Expectation:
    """`live`: the deployment serves other requests meanwhile (a rolling restart), which share
    the check's batches; vLLM's kernels are not batch-invariant, so only a tolerance holds."""
    if live:
        return outputs.Expectation("tolerance", outputs.TOLERANCE, "live traffic shares batches")
    dst_role = Role.DECODE if any(p.role == Role.DECODE for p in plan.processes) else Role.MIXED
    dsts = [p for p in plan.processes if p.role == dst_role]
    hw = {h.name: h.hardware for h in plan.hosts}
    hardware = {hw.get(p.host, "cpu") for p in [ref, *dsts]}
    return outputs.expectation(tp_of(ref), {tp_of(p) for p in dsts}, hardware)


def bench_default(plan: Plan, *, restarted: bool) -> bool:
    """`kvpd bench`'s default: on for rehearsals and CPU deployments (the local one), and for
    a deployment the bench itself (re)started for a scenario, which no canary checked. Off for
    a real cluster benched as it is: `kvpd up`'s canary checked its outputs already, and the
    reference requests would go straight to a prefill engine, outside the proxy's routing and
    load accounting, in the middle of the measurement. `--verify-outputs` turns it on."""
    if plan.rehearsal or restarted:
        return True
    hw = {h.name: h.hardware for h in plan.hosts}
    engines = [p for p in plan.processes if p.role in ENGINE_ROLES]
    return bool(engines) and all(hw.get(p.host, "cpu") == "cpu" for p in engines)


def body(model: str, text: str, n_tokens: int) -> dict[str, Any]:
    """Greedy, seeded, fixed length, with the logprobs of each token by id."""
    return {
        "model": model,
        "prompt": text,
        "max_tokens": n_tokens,
        "temperature": 0,
        "seed": SEED,
        "ignore_eos": True,
        "logprobs": TOP_LOGPROBS,
        "return_tokens_as_token_ids": True,
        "stream": False,
    }


def _served_by(d: metrics.Delta) -> str:
    """`prefill-0 -> decode-1` (or `mixed-1`): the engines whose request count grew."""
    grew = {role: [n for n, v in d.per_target.items()
                   if d.roles[n] == role and v.get("requests", 0) > 0]
            for role in ENGINE_ROLES}  # fmt: skip
    if grew[Role.DECODE]:
        src = "/".join(grew[Role.PREFILL]) or "?"
        return f"{src} -> {'/'.join(grew[Role.DECODE])}"
    return "/".join(grew[Role.MIXED])


def run(
    plan: Plan,
    post: Post,
    prompt: Prompt,
    transports: Transports,
    *,
    prompts: int = PROMPTS,
    n_tokens: int = TOKENS,
    timeout_s: float = 120.0,
    live: bool = False,
) -> outputs.OutputReport:
    """Send, compare, report (every failure is in the report, nothing raises). The /metrics
    scrapes go through `transports`, the requests through `post`."""
    t0 = time.monotonic()
    ref = reference_process(plan)
    if ref is None or not plan.proxy_url:
        exp = outputs.Expectation("identical", outputs.IDENTICAL_TOLERANCE, "")
        return outputs.OutputReport(n_tokens, exp, errors=["no reference engine or no proxy"])
    report = outputs.OutputReport(n_tokens, expectation_for(plan, ref, live=live))
    tgts = [t for t in metrics.targets(plan) if t.role != Role.PROXY]
    for i in range(prompts):
        b = body(plan.served_model, prompt(), n_tokens)
        try:
            want = outputs.parse_completion(post(base_url(ref), b, timeout_s=timeout_s))
        except (OSError, ValueError, TransportError) as e:
            report.errors.append(f"prompt {i + 1}: {ref.name} alone failed: {_reason(e)}")
            continue
        before = metrics.scrape(tgts, transports, timeout_s=10)
        try:
            got = outputs.parse_completion(post(plan.proxy_url, b, timeout_s=timeout_s))
        except (OSError, ValueError, TransportError) as e:
            report.errors.append(f"prompt {i + 1}: through {plan.proxy_url} failed: {_reason(e)}")
            continue
        pair = _served_by(
            metrics.delta(tgts, before, metrics.scrape(tgts, transports, timeout_s=10))
        )
        verdict = outputs.compare(want, got, n_tokens, report.expectation)
        report.outcomes.append(outputs.Outcome(i, ref.name, pair, verdict, want.text, got.text))
    report.seconds = time.monotonic() - t0
    return report


def _reason(e: BaseException) -> str:
    code = getattr(e, "code", None)
    if isinstance(code, int):
        return f"HTTP {code}"
    return str(getattr(e, "reason", e))
