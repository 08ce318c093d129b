"""Results of one `vllm bench serve` run: its saved JSON and the printed result block."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p50", "p90", "p99")
# Scalars the report, CSV and gate use; everything else of the JSON is kept verbatim in `raw`.
SCALARS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "max_concurrency",
    "request_rate",
    "num_prompts",
)
# stdout label -> JSON key, for the lines of the `Serving Benchmark Result` block.
_STDOUT_KEYS = {
    "Successful requests": "completed",
    "Failed requests": "failed",
    "Maximum request concurrency": "max_concurrency",
    "Request rate configured (RPS)": "request_rate",
    "Benchmark duration (s)": "duration",
    "Total input tokens": "total_input_tokens",
    "Total generated tokens": "total_output_tokens",
    "Request throughput (req/s)": "request_throughput",
    "Request goodput (req/s)": "request_goodput",
    "Output token throughput (tok/s)": "output_throughput",
    "Peak output token throughput (tok/s)": "max_output_tokens_per_s",
    "Peak concurrent requests": "max_concurrent_requests",
    "Total token throughput (tok/s)": "total_token_throughput",
}
_HEADER = "Serving Benchmark Result"
_STAT_LINE = re.compile(r"^(Mean|Median|P[0-9.]+)\s+([A-Z0-9]+)\s+\(ms\):\s+(\S+)")


def parse_stdout(text: str) -> dict[str, Any]:
    """The numbers of the result block (from the header line to the closing `====` line).
    Unknown lines are ignored; a missing block gives {}."""
    out: dict[str, Any] = {}
    inside = False
    for line in text.splitlines():
        s = line.strip()
        if _HEADER in s:
            inside = True
            continue
        if not inside:
            continue
        if s.startswith("=") and set(s) == {"="}:
            break
        m = _STAT_LINE.match(s)
        if m:
            stat, metric, raw = m.group(1).lower(), m.group(2).lower(), m.group(3)
            value = _number(raw)
            if value is not None:
                out[f"{stat}_{metric}_ms"] = value
            continue
        if ":" in s:
            label, _, raw = s.rpartition(":")
            key = _STDOUT_KEYS.get(label.strip())
            value = _number(raw.strip())
            if key and value is not None:
                out[key] = value
    return out


def _number(raw: str) -> float | int | None:
    try:
        f = float(raw)
    except ValueError:
        return None
    return int(f) if f.is_integer() and "." not in raw and "e" not in raw.lower() else f


def load_json(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """The scalars of a saved result (missing keys are simply absent; `request_rate` "inf"
    stays a string), plus kvpd's metadata keys."""
    out: dict[str, Any] = {}
    for key in SCALARS:
        if key in raw and raw[key] is not None:
            out[key] = raw[key]
    for metric in METRICS:
        for stat in STATS:
            key = f"{stat}_{metric}_ms"
            v = raw.get(key)
            if isinstance(v, (int, float)) and not math.isnan(v):
                out[key] = float(v)
    for key, v in raw.items():
        if key.startswith("kvpd_"):
            out[key] = v
    return out


def merge(from_json: dict[str, Any], from_stdout: dict[str, Any]) -> dict[str, Any]:
    """JSON wins (full precision); the printed block fills what the JSON lacks (e.g. the run
    died before saving, or an older client without some keys)."""
    out = dict(from_stdout)
    out.update(summarize(from_json))
    return out


def value(result: dict[str, Any], metric: str, stat: str = "mean") -> float | None:
    """e.g. value(r, "ttft", "p99") -> r["p99_ttft_ms"]; median falls back to p50."""
    v = result.get(f"{stat}_{metric}_ms")
    if v is None and stat == "median":
        v = result.get(f"p50_{metric}_ms")
    return float(v) if isinstance(v, (int, float)) else None
