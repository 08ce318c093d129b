"""The output check's comparison: does the P/D path generate what one engine generates alone?

The /metrics proof shows that KV moved; it cannot see KV that moved with the wrong content
(a layout or head-slicing bug between prefill TP and decode TP, a dtype mismatch, a stale or
colliding block): every counter is right and decode returns fluent garbage. So a few greedy
completions go once through the proxy and once to a reference engine without disaggregation,
and are compared token by token here (pure: the requests are made by kvpd.bench.output_check).

When exact equality is expected, and when only a tolerance:
- `identical`: reference and decode run the same tensor-parallel size on the same hardware
  and the check's requests are sent one at a time (no batching with other requests). The
  prompt's KV decode uses is then the bytes the reference engine computed; only the last
  prompt token is recomputed by decode in a different kernel call, so the tokens must be the
  same and their logprobs equal within IDENTICAL_TOLERANCE.
- `tolerance`: the TP sizes differ (the reduction order of the attention and MLP sums
  changes) or the hardware differs. Logprobs of the reference tokens must agree within
  TOLERANCE; a different token is accepted only at a near tie (the reference token is in the
  candidate's top logprobs within TOLERANCE of the chosen one), and the comparison stops there
  because the continuations legitimately part.
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["identical", "tolerance"]
# nats. Identical inputs on one kernel family still differ in the last bf16 bit of a sum.
IDENTICAL_TOLERANCE = 0.05
TOLERANCE = 0.5
_TOKEN_ID = "token_id:"


@dataclass(frozen=True)
class Sample:
    """One completion: generated token ids, their logprobs, and each position's top logprobs."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[dict[int, float], ...] = ()
    text: str = ""


@dataclass(frozen=True)
class Expectation:
    """How two completions must agree, and why (shown in the report)."""

    mode: Mode
    tolerance: float
    reason: str


def expectation(ref_tp: int, dst_tps: set[int], hardware: AbstractSet[str]) -> Expectation:
    """`identical` when the reference and every decode engine run one TP size on one kind of
    hardware, else `tolerance` (see the module docstring)."""
    tps = {ref_tp, *dst_tps}
    if len(tps) > 1:
        why = f"TP {ref_tp} on the reference, {'/'.join(map(str, sorted(dst_tps)))} on decode"
        return Expectation("tolerance", TOLERANCE, why)
    if len(hardware) > 1:
        return Expectation("tolerance", TOLERANCE, f"hardware {'/'.join(sorted(hardware))}")
    return Expectation("identical", IDENTICAL_TOLERANCE, f"same TP ({ref_tp}), one at a time")


def _token(raw: Any) -> int:
    if isinstance(raw, str) and raw.startswith(_TOKEN_ID):
        return int(raw[len(_TOKEN_ID) :])
    raise ValueError(f"token {str(raw)[:40]!r} is not 'token_id:N' (return_tokens_as_token_ids)")


def _logprob(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or math.isnan(raw):
        raise ValueError(f"logprob {str(raw)[:40]!r} is not a number")
    return float(raw)


def parse_completion(body: Any) -> Sample:
    """A /v1/completions answer (asked with logprobs and return_tokens_as_token_ids) as a
    Sample. What an engine or proxy sends is untrusted: ValueError says what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("the answer is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices")
    choice = choices[0]
    raw_text = choice.get("text")
    text = raw_text if isinstance(raw_text, str) else ""
    lp = choice.get("logprobs")
    if lp is None:
        if text:
            raise ValueError("the answer has text but no logprobs (the proxy dropped them?)")
        return Sample((), (), (), "")
    if not isinstance(lp, dict):
        raise ValueError("choices[0].logprobs is not an object")
    tokens, values = lp.get("tokens") or [], lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        raise ValueError("choices[0].logprobs: tokens and token_logprobs differ in length")
    ids = tuple(_token(t) for t in tokens)
    lps = tuple(_logprob(v) for v in values)
    top: list[dict[int, float]] = []
    for entry in tops if isinstance(tops, list) else []:
        if isinstance(entry, dict):
            top.append({_token(k): _logprob(v) for k, v in entry.items()})
        else:
            top.append({})
    return Sample(ids, lps, tuple(top), text)


@dataclass(frozen=True)
class Verdict:
    """One prompt's comparison. `diverged_at`: first position that disagrees (None: none)."""

    ok: bool
    compared: int
    diverged_at: int | None = None
    detail: str = ""
    max_delta: float = 0.0
    near_tie: bool = False


def compare(ref: Sample, got: Sample, n_tokens: int, exp: Expectation) -> Verdict:
    """Token by token over the first `n_tokens` (see the module docstring for the modes)."""
    if not got.token_ids:
        return Verdict(False, 0, 0, "no tokens came back")
    if len(ref.token_ids) < n_tokens:
        return Verdict(False, 0, None, f"the reference returned {len(ref.token_ids)} of "
                       f"{n_tokens} tokens")  # fmt: skip
    max_delta = 0.0
    for i in range(n_tokens):
        if i >= len(got.token_ids):
            return Verdict(False, i, i, f"truncated: {len(got.token_ids)} of {n_tokens} tokens",
                           max_delta)  # fmt: skip
        r, g = ref.token_ids[i], got.token_ids[i]
        if r == g:
            d = abs(ref.logprobs[i] - got.logprobs[i])
            max_delta = max(max_delta, d)
            if d > exp.tolerance:
                return Verdict(False, i + 1, i, f"token {r}: logprob {ref.logprobs[i]:.4f} "
                               f"vs {got.logprobs[i]:.4f} (|d| {d:.4f} > {exp.tolerance:g})",
                               max_delta)  # fmt: skip
            continue
        alt = got.top[i].get(r) if i < len(got.top) else None
        if (
            exp.mode == "tolerance"
            and alt is not None
            and abs(alt - got.logprobs[i]) <= exp.tolerance
            and abs(alt - ref.logprobs[i]) <= exp.tolerance
        ):
            return Verdict(True, i + 1, None, f"near tie at token {i}", max_delta, near_tie=True)
        seen = "" if alt is None else f", reference token at {alt:.4f}"
        return Verdict(False, i + 1, i, f"expected token {r} (logprob {ref.logprobs[i]:.4f}), "
                       f"got {g} (logprob {got.logprobs[i]:.4f}{seen})", max_delta)  # fmt: skip
    return Verdict(True, n_tokens, None, "", max_delta)


@dataclass
class Outcome:
    """One prompt: which processes served it through the proxy, and the verdict."""

    index: int
    reference: str  # process that answered alone
    pair: str  # "prefill-0 -> decode-1" (or the mixed instance); "" when unknown
    verdict: Verdict
    ref_text: str = ""
    got_text: str = ""


@dataclass
class OutputReport:
    """The output check of one canary or bench phase."""

    n_tokens: int
    expectation: Expectation
    outcomes: list[Outcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # requests that failed outright
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors and bool(self.outcomes) and all(o.verdict.ok for o in self.outcomes)

    @property
    def passed(self) -> int:
        return sum(1 for o in self.outcomes if o.verdict.ok)

    @property
    def total(self) -> int:
        return len(self.outcomes) + len(self.errors)

    def summary(self) -> str:
        """e.g. `outputs: 4/4 identical (first 16 tokens)`."""
        if self.expectation.mode == "identical":
            how = "identical"
        else:
            exp = self.expectation
            how = f"within logprob tolerance {exp.tolerance:g} ({exp.reason})"
        word = "" if self.ok else " FAILED:"
        return f"outputs:{word} {self.passed}/{self.total} {how} (first {self.n_tokens} tokens)"

    def problems(self, where: str) -> list[str]:
        out = [f"{where}: output check: {e}" for e in self.errors]
        for o in self.outcomes:
            if o.verdict.ok:
                continue
            v = o.verdict
            at = "" if v.diverged_at is None else f" at token {v.diverged_at}"
            path = o.pair or "the proxy"
            out.append(
                f"{where}: outputs differ: prompt {o.index + 1} through {path} diverges from "
                f"{o.reference} alone (no KV transfer){at}: {v.detail}. Reference "
                f"{o.ref_text[:60]!r}, got {o.got_text[:60]!r}. The /metrics counters cannot "
                "see this: KV arrived with the wrong content (block layout, dtype, TP head "
                "slicing, a stale or colliding store entry). Check that prefill and decode "
                "run the same model, dtype and KV connector settings."
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "summary": self.summary(),
            "n_tokens": self.n_tokens,
            "mode": self.expectation.mode,
            "tolerance": self.expectation.tolerance,
            "reason": self.expectation.reason,
            "seconds": round(self.seconds, 3),
            "errors": list(self.errors),
            "prompts": [
                {
                    "index": o.index,
                    "reference": o.reference,
                    "pair": o.pair,
                    **asdict(o.verdict),
                }  # fmt: skip
                for o in self.outcomes
            ],
        }
