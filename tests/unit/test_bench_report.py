"""Report tables, saved JSON/CSV, charts, --compare and the regression gate."""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from kvpd.bench import charts, compare, gate, records, report, serve_output
from kvpd.bench.records import BenchRun, Record
from kvpd.errors import BenchError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


def _record(scenario: str, input_len: int, scale: float = 1.0, phase: str = "measured") -> Record:
    """A record built from a real saved result, latencies scaled by `scale`."""
    raw = json.loads((FIX / "pd_measured.json").read_text())
    res = serve_output.summarize(raw)
    for k in list(res):
        if k.endswith("_ms"):
            res[k] *= scale
    for k in ("output_throughput", "request_throughput", "total_token_throughput"):
        res[k] /= scale
    deltas = json.loads((FIX / "pd_deltas.json").read_text())["measured"]
    return Record(scenario, phase, True, input_len, 16, 4, "inf", 20, result=res,
                  metrics={"summary": {"decode_requests": 20.0}, **deltas})  # fmt: skip


def _run(*records: Record) -> BenchRun:
    cache = {"recompute": "none", "hbm": "hbm", "external": "external"}
    return BenchRun("local", "local", "abc", "prefix", "2026-01-01T00:00:00",
                    scenarios=[{"name": n, "sets": [], "cache": cache.get(n)}
                               for n in dict.fromkeys(r.scenario for r in records)],
                    records=list(records))  # fmt: skip


def _text(renderable: object) -> str:
    c = Console(width=250, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


def test_results_table_has_the_guide_shape_and_speedup() -> None:
    run = _run(_record("recompute", 128, 2.0), _record("hbm", 128, 1.0),
               _record("recompute", 256, 2.0), _record("hbm", 256, 1.0))  # fmt: skip
    text = _text(report.results_table(run))
    assert "recompute" in text
    assert "hbm" in text
    for label in ("TTFT", "TPOT", "E2EL", "speedup"):
        assert label in text
    assert "2.00x / 2.00x" in text  # recompute twice as slow as hbm on TTFT and E2EL
    rows = [ln for ln in text.splitlines() if re.match(r"^│\s+(128|256)\s+│\s+16\s+│", ln)]
    assert len(rows) == 2  # one row per input/output length
    med = _text(report.results_table(run, "p99"))
    assert "p99 latency" in med


def test_speedup_is_against_recompute_whatever_the_order() -> None:
    """The guide's columns: recompute, HBM PC, UCM PC; speedups are against recompute even
    when it is not the first scenario run."""
    run = _run(_record("external", 128, 1.0), _record("hbm", 128, 2.0),
               _record("recompute", 128, 4.0))  # fmt: skip
    text = _text(report.results_table(run))
    assert "4.00x / 4.00x" in text
    assert "2.00x / 2.00x" in text
    assert "recompute\nspeedup" not in text
    assert text.count("speedup") == 2


def test_single_length_charts_are_bars_and_a_ttft_cdf(tmp_path: Path) -> None:
    """One input length: a bar per scenario and the per-request TTFT distribution from the
    saved per-request data (vllm bench serve --save-detailed's `ttfts`, in seconds)."""
    recs = []
    for name, scale in (("recompute", 3.0), ("hbm", 2.0), ("external", 1.0)):
        r = _record(name, 128, scale)
        raw = tmp_path / f"{name}.json"
        raw.write_text(json.dumps({"ttfts": [0.01 * scale * (k + 1) for k in range(20)] + [0.0]}))
        r.raw_file = str(raw)
        recs.append(r)
        assert charts.request_ttfts(r)[0] == pytest.approx(10.0 * scale)  # failed 0.0 dropped
        assert len(charts.request_ttfts(r)) == 20
    pngs = charts.charts(_run(*recs), tmp_path)
    assert [p.name for p in pngs] == ["latency.png", "ttft_cdf.png"]
    assert all(p.stat().st_size > 10_000 for p in pngs)


def test_failed_record_is_not_shown_as_a_result() -> None:
    bad = _record("hbm", 128)
    bad.result = {"completed": 0, "failed": 20}
    bad.problems = ["scenario 'hbm', phase measured: 20 of 20 requests failed."]
    text = _text(report.results_table(_run(_record("recompute", 128), bad)))
    assert "failed" in text
    assert "FAILED" in _text(report.proof_table(_run(bad)))


def test_save_load_roundtrip_csv_and_charts(tmp_path: Path) -> None:
    seed = _record("hbm", 128, phase="seed")
    seed.measured = False
    run = _run(seed, _record("hbm", 128), _record("hbm", 256, 1.5))
    j, c = records.save(run, tmp_path)
    back = records.load(tmp_path)
    assert back.to_dict() == run.to_dict()
    assert [r.key for r in back.measured] == [r.key for r in run.measured]
    with open(c) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    assert rows[1]["scenario"] == "hbm"
    assert rows[1]["input_len"] == "128"
    assert float(rows[1]["mean_ttft_ms"]) == pytest.approx(run.records[1].result["mean_ttft_ms"])
    pngs = charts.charts(run, tmp_path)
    assert [p.name for p in pngs] == ["latency.png"]  # swept input lengths, no per-request data
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    with pytest.raises(BenchError, match="no saved bench run"):
        records.load(tmp_path / "nothing")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(BenchError, match="not a kvpd bench result"):
        records.load(tmp_path / "other.json")
    saved = json.loads(j.read_text())
    saved["records"][0]["phase"] = "lunch"
    j.write_text(json.dumps(saved))
    with pytest.raises(BenchError, match="record phase 'lunch' is not one of run, seed"):
        records.load(tmp_path)


def test_compare_and_gate() -> None:
    a = _run(_record("hbm", 128), _record("hbm", 256))
    b = _run(_record("hbm", 128, 1.05), _record("hbm", 256, 1.25))
    ds = {(d.record, d.metric): d for d in compare.diffs(a, b)}
    d = ds[("hbm/measured 256/16 c=4", "TTFT mean")]
    assert d.change == pytest.approx(0.25)
    assert d.regression == pytest.approx(0.25)
    thr = ds[("hbm/measured 256/16 c=4", "output tok/s")]
    assert thr.regression == pytest.approx(0.2)  # throughput 1/1.25 = -20 %: worse
    assert "+25.0%" in _text(compare.compare_table(a, b))
    assert gate.parse_percent("10%") == pytest.approx(0.10)
    assert gate.parse_percent("7.5") == pytest.approx(0.075)
    with pytest.raises(BenchError):
        gate.parse_percent("ten")
    gate.gate(a, b, 0.30)  # 25 % is allowed at 30 %
    problems = gate.regressions(a, b, 0.10)
    assert problems
    assert all("256/16" in p for p in problems)  # 5 % on 128 passes
    with pytest.raises(BenchError, match="regression gate failed"):
        gate.gate(a, b, 0.10)
    gate.gate(b, a, 0.0)  # getting faster is never a regression


def test_gate_fails_on_missing_or_failed_records() -> None:
    a = _run(_record("hbm", 128), _record("hbm", 256))
    b = _run(_record("hbm", 128))
    assert any("not in this run" in p for p in gate.regressions(a, b, 0.5))
    bad = copy.deepcopy(a)
    bad.records[0].problems = ["decode received no KV"]
    assert any("failed in this run" in p for p in gate.regressions(a, bad, 0.5))


def test_cli_compare_and_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvpd.cli.main import main

    records.save(_run(_record("hbm", 128)), tmp_path / "a")
    records.save(_run(_record("hbm", 128, 1.2)), tmp_path / "b")
    with pytest.raises(SystemExit) as e:
        main(["bench", "--compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert e.value.code == 0
    assert "TTFT mean" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["bench", "--compare", str(tmp_path / "a"), str(tmp_path / "b"),
              "--max-regression", "10%"])  # fmt: skip
    assert e.value.code == 1
    assert "regression gate failed" in capsys.readouterr().err


def test_single_phase_latency_table_has_mean_median_p99_of_every_metric() -> None:
    from kvpd.bench.report import latency_table

    text = _text(latency_table(_record("as-is", 128)))
    for word in ("TTFT", "TPOT", "ITL", "E2EL", "mean", "median", "p99", "req/s"):
        assert word in text
