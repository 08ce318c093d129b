"""Empty and truncated output: a phase whose requests "succeeded" with no or too few tokens.

`vllm bench serve` counts a request as completed when its stream ended without an error, even
if it carried no token (a P/D deployment whose KV transfer failed can do exactly that). Its
saved result (`--save-detailed`) lists per request `output_lens` and `errors`; a request with
no error and zero output tokens is empty, and with `--ignore-eos` one with fewer than the
phase's output length is truncated. Either fails the phase, with the count.
"""

from __future__ import annotations

from typing import Any


def _ints(raw: Any) -> list[int] | None:
    if not isinstance(raw, list):
        return None
    out = []
    for v in raw:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        out.append(int(v))
    return out


def problems(where: str, raw: dict[str, Any], *, output_len: int, ignore_eos: bool) -> list[str]:
    """Messages for empty and truncated requests of one phase's saved result (raw JSON)."""
    lens = _ints(raw.get("output_lens"))
    if lens is None:
        completed = raw.get("completed")
        total = raw.get("total_output_tokens")
        if isinstance(completed, int) and completed > 0 and total == 0:
            return [f"{where}: {completed} requests completed but 0 tokens were generated "
                    "(total_output_tokens 0): empty output is not a result."]  # fmt: skip
        return []
    errors = raw.get("errors")
    errs = errors if isinstance(errors, list) and len(errors) == len(lens) else [""] * len(lens)
    ok = [n for n, e in zip(lens, errs, strict=True) if not e]
    out = []
    empty = sum(1 for n in ok if n <= 0)
    if empty:
        out.append(
            f"{where}: {empty} of {len(ok)} successful requests returned zero tokens: the "
            "deployment answers without generating (a failed KV transfer can do this). Check "
            "`kvpd logs decode-0` and the connector's transfer errors."
        )
    if ignore_eos:
        short = [n for n in ok if 0 < n < output_len]
        if short:
            out.append(
                f"{where}: {len(short)} of {len(ok)} successful requests returned fewer than "
                f"{output_len} tokens with --ignore-eos (shortest {min(short)}): output is "
                "truncated, so the latency numbers are not for this output length."
            )
    return out
