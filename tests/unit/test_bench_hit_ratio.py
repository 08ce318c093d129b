"""`kvpd bench` shows the prefilling engines' prefix-cache hit ratio of every phase, from the
deltas of vLLM's counters on their /metrics."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from kvpd.bench import metrics as m
from kvpd.bench import records, report
from kvpd.bench.records import BenchRun, Record

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


def _snap(name: str, hits: float, queries: float) -> m.Snapshot:
    text = f"vllm:prefix_cache_hits_total {hits}\nvllm:prefix_cache_queries_total {queries}\n"
    return m.Snapshot(samples={name: m.parse(text)})


def test_the_ratio_is_the_prefilling_engines_hits_over_their_lookups() -> None:
    tgts = [m.Target("prefill-0", "prefill", "u"), m.Target("decode-0", "decode", "u")]
    before = m.Snapshot(samples={**_snap("prefill-0", 100, 1000).samples,
                                 **_snap("decode-0", 0, 0).samples})  # fmt: skip
    after = m.Snapshot(samples={**_snap("prefill-0", 900, 2000).samples,
                                **_snap("decode-0", 5000, 9000).samples})  # fmt: skip
    s = m.delta(tgts, before, after).summary()
    assert s["prefix_hit_ratio"] == 0.8  # the decoder's own lookups do not count
    mixed = [m.Target("mixed-0", "mixed", "u")]
    s = m.delta(mixed, _snap("mixed-0", 0, 0), _snap("mixed-0", 0, 0)).summary()
    assert s["prefix_hit_ratio"] is None  # nothing looked up: no ratio, not 0


def test_the_proof_table_and_the_csv_show_it(tmp_path: Path) -> None:
    deltas = json.loads((FIX / "pd_deltas.json").read_text())["measured"]
    deltas["summary"] = {**deltas.get("summary", {}), "prefix_hit_ratio": 0.7968}
    seed = Record("hbm", "seed", False, 128, 16, 4, "inf", 20, metrics={"summary": {}})
    rec = Record("hbm", "measured", True, 128, 16, 4, "inf", 20, result={}, metrics=deltas)
    run = BenchRun("local", "local", "abc", "prefix", "2026-01-01T00:00:00",
                   scenarios=[{"name": "hbm", "sets": [], "cache": "hbm"}],
                   records=[seed, rec])  # fmt: skip
    console = Console(width=250, record=True, color_system=None)
    console.print(report.proof_table(run))
    text = console.export_text()
    assert "hit ratio" in text
    assert "0.797" in text
    _, csv_path = records.save(run, tmp_path)
    assert "prefix_hit_ratio" in csv_path.read_text().splitlines()[0]
