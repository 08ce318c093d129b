"""A bench run's records, written as results.json + results.csv and read back for compare/gate."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from kvpd import __version__
from kvpd.bench.serve_output import METRICS
from kvpd.errors import BenchError

FORMAT = "kvpd-bench/1"
# The phases of the protocols (kvpd.bench.runner.protocol_phases): plain runs `run`, prefix
# `seed` then `measured`, twice `cold` then `warm`.
PhaseName = Literal["run", "seed", "measured", "cold", "warm"]
RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"


@dataclass
class Record:
    """One phase of one sweep point of one scenario."""

    scenario: str
    phase: PhaseName
    measured: bool
    input_len: int
    output_len: int
    max_concurrency: int | None
    request_rate: float | str
    num_prompts: int
    result: dict[str, Any] = field(default_factory=dict)  # results.summarize/merge output
    metrics: dict[str, Any] = field(default_factory=dict)  # metrics.Delta.to_dict()
    problems: list[str] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # OutputReport.to_dict(); {}: not run
    raw_file: str = ""
    log: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def outputs_failed(self) -> bool:
        """The output check ran and failed: its numbers measure wrong output."""
        return bool(self.outputs) and not self.outputs.get("ok", False)

    @property
    def key(self) -> tuple[str, str, int, int, int | None]:
        return (self.scenario, self.phase, self.input_len, self.output_len, self.max_concurrency)

    @property
    def label(self) -> str:
        c = "" if self.max_concurrency is None else f" c={self.max_concurrency}"
        return f"{self.scenario}/{self.phase} {self.input_len}/{self.output_len}{c}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        known = {f for f in cls.__dataclass_fields__}
        if d.get("phase") not in get_args(PhaseName):
            raise ValueError(f"record phase {d.get('phase')!r} is not one of "
                             f"{', '.join(get_args(PhaseName))}")  # fmt: skip
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class BenchRun:
    profile: str
    deployment: str
    plan_digest: str
    protocol: str
    created: str
    settings: dict[str, Any] = field(default_factory=dict)
    scenarios: list[dict[str, Any]] = field(default_factory=list)  # {"name", "sets"}
    records: list[Record] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # problems outside any record
    out_dir: str = ""
    notes: list[str] = field(default_factory=list)  # what the logs confirmed
    kvpd_version: str = __version__  # the kvpd that ran the bench
    client: str = ""  # where `vllm bench serve` ran ("this machine", "p1, the proxy's host")

    @property
    def measured(self) -> list[Record]:
        return [r for r in self.records if r.measured]

    @property
    def problems(self) -> list[str]:
        return [*self.failures, *(p for r in self.records for p in r.problems)]

    @property
    def ok(self) -> bool:
        return not self.problems

    def outputs_failed(self) -> list[str]:
        """Labels of the records whose output check failed."""
        return [r.label for r in self.records if r.outputs_failed]

    def scenario_names(self) -> list[str]:
        names = [s["name"] for s in self.scenarios]
        for r in self.records:
            if r.scenario not in names:
                names.append(r.scenario)
        return names

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = FORMAT
        d["ok"] = self.ok
        # the output checks at a glance: "as-is/run 128/16 c=4: outputs: 4/4 identical (...)"
        d["outputs"] = [f"{r.label}: {r.outputs.get('summary', '')}" for r in self.records
                        if r.outputs]  # fmt: skip
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchRun:
        return cls(
            profile=d.get("profile", ""),
            deployment=d.get("deployment", ""),
            plan_digest=d.get("plan_digest", ""),
            protocol=d.get("protocol", "plain"),
            created=d.get("created", ""),
            settings=d.get("settings", {}),
            scenarios=d.get("scenarios", []),
            records=[Record.from_dict(r) for r in d.get("records", [])],
            failures=list(d.get("failures", [])),
            out_dir=d.get("out_dir", ""),
            notes=list(d.get("notes", [])),
            kvpd_version=str(d.get("kvpd_version", "")),
            client=str(d.get("client", "")),
        )


_CSV_RESULT_KEYS = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{s}_{m}_ms" for m in METRICS for s in ("mean", "median", "p90", "p99")),
)
_CSV_METRIC_KEYS = (
    "prefill_requests",
    "decode_requests",
    "mixed_requests",
    "decode_kv_received_tokens",
    "decode_cached_tokens",
    "decode_computed_tokens",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "prefix_hit_ratio",
    "external_prefix_cache_hits",
    "local_cache_hit_tokens",
    "prompt_tokens",
    "proxy_disaggregated",
    "proxy_handoffs",
)


def save(run: BenchRun, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    j = out_dir / RESULTS_JSON
    tmp = j.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(run.to_dict(), indent=2, default=str) + "\n")
    tmp.replace(j)
    c = out_dir / RESULTS_CSV
    head = ["scenario", "phase", "measured", "input_len", "output_len", "max_concurrency",
            "request_rate", "num_prompts", *_CSV_RESULT_KEYS, *_CSV_METRIC_KEYS, "outputs",
            "ok", "problems"]  # fmt: skip
    with open(c, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in run.records:
            summary = r.metrics.get("summary", {})
            w.writerow(
                [r.scenario, r.phase, r.measured, r.input_len, r.output_len,
                 "" if r.max_concurrency is None else r.max_concurrency, r.request_rate,
                 r.num_prompts]
                + [_cell(r.result.get(k)) for k in _CSV_RESULT_KEYS]
                + [_cell(summary.get(k)) for k in _CSV_METRIC_KEYS]
                + [r.outputs.get("summary", ""), r.ok, " | ".join(r.problems)]
            )  # fmt: skip
    return j, c


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4f}".rstrip("0").rstrip(".") if v == v else ""
    return str(v)


def load(path: str | Path) -> BenchRun:
    """A saved run: its results.json, or the folder holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / RESULTS_JSON
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise BenchError(
            f"{p}: no saved bench run here (expected {RESULTS_JSON} written by `kvpd bench`)."
        ) from None
    except ValueError as e:
        raise BenchError(f"{p}: not a JSON file ({e}).") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BenchError(f"{p}: not a kvpd bench result (format {FORMAT!r} expected).")
    try:
        return BenchRun.from_dict(data)
    except (ValueError, KeyError, TypeError) as e:
        raise BenchError(f"{p}: not a kvpd bench result as kvpd writes it ({e}).") from None
