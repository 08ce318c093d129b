"""The output check in `kvpd bench`: per phase in the session, in the tables and results.json,
and refused by --compare and the regression gate when it failed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvpd.bench import gate, records, report, runner
from kvpd.bench.records import BenchRun
from kvpd.bench.session import Session
from kvpd.bench.settings import make_settings
from kvpd.errors import BenchError
from kvpd.exec.service import Deployments
from kvpd.exec.state import StateStore
from tests.unit.test_bench_outputs import answer
from tests.unit.test_bench_proof import FIX, _MetricsServer, _plan
from tests.unit.test_bench_report import _record, _text

GOOD = {"ok": True, "summary": "outputs: 4/4 identical (first 16 tokens)", "mode": "identical",
        "tolerance": 0.05, "errors": [], "prompts": [{"ok": True}] * 4}  # fmt: skip
BAD = {**GOOD, "ok": False, "summary": "outputs: FAILED: 3/4 identical (first 16 tokens)",
       "prompts": [{"ok": True}] * 3 + [{"ok": False}]}  # fmt: skip


def _run(outputs: dict) -> BenchRun:
    rec = _record("as-is", 128)
    rec.outputs = dict(outputs)
    if not outputs.get("ok", True):
        rec.problems.append("outputs differ")
    return BenchRun("local", "local", "abc", "plain", "2026-01-01T00:00:00", records=[rec])


def test_tables_and_lines_say_how_many_outputs_matched() -> None:
    text = _text(report.proof_table(_run(GOOD)))
    assert "outputs" in text
    assert "4/4 identical" in text
    assert "3/4 FAILED" in _text(report.proof_table(_run(BAD)))
    assert report.outputs_lines(_run(GOOD)) == [
        "as-is/measured 128/16 c=4: outputs: 4/4 identical (first 16 tokens)"
    ]
    tol = {**GOOD, "mode": "tolerance", "tolerance": 0.5}
    assert "4/4 ±0.5" in _text(report.proof_table(_run(tol)))
    assert report.outputs_lines(_run({})) == []  # not checked: no line, "-" in the table
    detail = " ".join(_text(report.latency_table(_run(GOOD).records[0])).split())  # wrapped
    assert "outputs: 4/4 identical (first 16 tokens)" in detail


def test_results_json_keeps_the_output_check(tmp_path: Path) -> None:
    records.save(_run(GOOD), tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["records"][0]["outputs"]["summary"] == "outputs: 4/4 identical (first 16 tokens)"
    assert saved["outputs"] == [
        "as-is/measured 128/16 c=4: outputs: 4/4 identical (first 16 tokens)"
    ]
    with open(tmp_path / "results.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["outputs"] == "outputs: 4/4 identical (first 16 tokens)"
    back = records.load(tmp_path)
    assert back.records[0].outputs == GOOD
    assert back.outputs_failed() == []


def test_compare_and_gate_refuse_runs_whose_outputs_failed() -> None:
    good, bad = _run(GOOD), _run(BAD)
    gate.refuse_wrong_outputs({"a": good, "b": good})
    with pytest.raises(BenchError, match="refusing to compare") as e:
        gate.refuse_wrong_outputs({"a": good, "b": bad})
    assert "b: as-is/measured 128/16 c=4" in str(e.value)
    assert gate.regressions(good, good, 0.1) == []
    assert any("outputs failed in the baseline" in p for p in gate.regressions(bad, good, 0.1))
    assert any("outputs differ from a single engine" in p for p in gate.regressions(good, bad, 0.1))


def _client(output_lens: list[int]):
    """`vllm bench serve` stand-in: a captured result with these per-request lengths."""

    def run(argv: list[str], *, env: dict, log: Path, timeout_s: float) -> runner.RunOutput:
        raw = json.loads((FIX / "seed.json").read_text())
        raw.update(output_lens=output_lens, errors=[""] * len(output_lens))
        out = Path(argv[argv.index("--result-dir") + 1]) / argv[argv.index("--result-filename") + 1]
        out.write_text(json.dumps(raw))
        stdout = (FIX / "seed.stdout.txt").read_text()
        log.write_text(stdout)
        return runner.RunOutput(argv, 0, stdout, str(log), 0.0)

    return run


def _session(tmp_path: Path, post, output_lens: list[int], verify: bool | None = None) -> BenchRun:
    read = lambda n: (FIX / n).read_text()  # noqa: E731
    servers = {
        "prefill-0": _MetricsServer([read("metrics_pd_prefill_before.txt"),
                                     read("metrics_pd_prefill_after.txt")]),
        "decode-0": _MetricsServer([read("metrics_pd_decode_before.txt"),
                                    read("metrics_pd_decode_after.txt")]),
        "proxy": _MetricsServer([read("metrics_pd_proxy_before.txt"),
                                 read("metrics_pd_proxy_after.txt")]),
    }  # fmt: skip
    try:
        plan = _plan({k: s.port for k, s in servers.items()})
        session = Session(profile="fake-pd", settings=make_settings(plan.bench), scenarios=[],
                          out_dir=tmp_path / "out", service=Deployments(StateStore(tmp_path / "s")),
                          load=lambda sets: plan, vllm="vllm", run_client=_client(output_lens),
                          post=post, verify_outputs=verify)  # fmt: skip
        return session.run()
    finally:
        for s in servers.values():
            s.close()


def test_session_checks_outputs_after_each_phase(tmp_path: Path) -> None:
    calls: list[str] = []

    def post(url: str, body: dict, *, timeout_s: float, key: str = "") -> dict:
        calls.append(url)
        wrong = len(calls) == 2  # reference, proxy, reference, ...: prompt 1's P/D answer
        return answer([9 if wrong else 1] * 16, [-1.0] * 16)

    run = _session(tmp_path, post, [16] * 20)  # CPU plan: on by default
    (rec,) = run.records
    assert len(calls) == 8
    assert rec.outputs["summary"].startswith("outputs: FAILED: 3/4")
    assert not run.ok
    assert any("outputs differ: prompt 1" in p for p in rec.problems)
    assert run.outputs_failed() == [rec.label]


def test_session_without_the_check_and_with_empty_output(tmp_path: Path) -> None:
    def post(url: str, body: dict, *, timeout_s: float, key: str = "") -> dict:
        raise AssertionError("the output check is off")

    run = _session(tmp_path, post, [16] * 18 + [0, 0], verify=False)
    (rec,) = run.records
    assert rec.outputs == {}
    assert any("2 of 20 successful requests returned zero tokens" in p for p in rec.problems)
