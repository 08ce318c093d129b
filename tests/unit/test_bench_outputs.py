"""The output check: parsing what engines send, token-by-token comparison in both modes, the
report line, empty/truncated phases, and the canary's verdict with it."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from kvpd.bench import canary, lengths, output_check, outputs
from kvpd.bench.metrics import Delta
from kvpd.bench.outputs import Expectation, Outcome, OutputReport, Sample, Verdict
from kvpd.exec.local import LocalTransport
from kvpd.exec.pool import TransportPool
from kvpd.plan.build import load_plan
from kvpd.plan.rehearsal_engines import STANDIN_SCRIPT
from kvpd.plan.value import HostSpec

SAME = outputs.expectation(1, {1}, {"cpu"})
TOL = outputs.expectation(2, {1}, {"a3"})


def answer(ids: list[int], lps: list[float], top: list[dict[int, float]] | None = None) -> dict:
    """A vLLM /v1/completions answer with logprobs and return_tokens_as_token_ids."""
    names = [f"token_id:{i}" for i in ids]
    tops = [{f"token_id:{k}": v for k, v in t.items()} for t in top] if top else []
    lp = {"tokens": names, "token_logprobs": lps, "top_logprobs": tops}
    return {"choices": [{"index": 0, "text": "x" * len(ids), "logprobs": lp}]}


def sample(ids: list[int], lps: list[float] | None = None, top=None) -> Sample:
    return outputs.parse_completion(answer(ids, lps or [-1.0] * len(ids), top))


def test_parse_reads_ids_logprobs_and_top() -> None:
    s = sample([5, 7], [-0.1, -2.0], [{5: -0.1, 9: -3.0}, {7: -2.0}])
    assert s.token_ids == (5, 7)
    assert s.logprobs == (-0.1, -2.0)
    assert s.top[0] == {5: -0.1, 9: -3.0}
    assert outputs.parse_completion({"choices": [{"text": ""}]}).token_ids == ()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "not a JSON object"),
        ({"choices": []}, "no choices"),
        ({"choices": [{"text": "hi"}]}, "no logprobs"),
        ({"choices": [{"logprobs": {"tokens": ["7"], "token_logprobs": [-1]}}]}, "token_id:N"),
        ({"choices": [{"logprobs": {"tokens": ["token_id:1"], "token_logprobs": []}}]}, "length"),
        (answer([1], [math.nan]), "not a number"),
        (
            {"choices": [{"logprobs": {"tokens": ["token_id:1"], "token_logprobs": ["x"]}}]},
            "not a number",
        ),
    ],
)
def test_parse_refuses_what_an_engine_should_not_send(body: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        outputs.parse_completion(body)


def test_identical_outputs_pass_and_report_the_largest_logprob_difference() -> None:
    v = outputs.compare(
        sample([1, 2, 3], [-1, -2, -3]), sample([1, 2, 3], [-1, -2.01, -3]), 3, SAME
    )
    assert v.ok
    assert v.compared == 3
    assert v.diverged_at is None
    assert v.max_delta == pytest.approx(0.01)


def test_first_diverging_token_is_named() -> None:
    v = outputs.compare(sample([1, 2, 3, 4]), sample([1, 2, 9, 4]), 4, SAME)
    assert not v.ok
    assert v.diverged_at == 2
    assert "expected token 3" in v.detail
    assert "got 9" in v.detail


def test_same_token_with_another_logprob_is_a_divergence() -> None:
    v = outputs.compare(sample([1, 2], [-1, -1]), sample([1, 2], [-1, -1.5]), 2, SAME)
    assert not v.ok
    assert v.diverged_at == 1
    assert "> 0.05" in v.detail


def test_tolerance_mode_accepts_a_near_tie_and_stops_there() -> None:
    ref = sample([1, 2, 3], [-0.5, -0.70, -1])
    got = sample([1, 8, 0], [-0.5, -0.69, -9], [{1: -0.5}, {8: -0.69, 2: -0.71}, {0: -9}])
    v = outputs.compare(ref, got, 3, TOL)
    assert v.ok
    assert v.near_tie
    assert v.compared == 2
    assert not outputs.compare(ref, got, 3, SAME).ok  # identical mode: a different token fails


def test_tolerance_mode_refuses_a_token_far_from_the_reference() -> None:
    ref = sample([1, 2], [-0.5, -0.1])
    got = sample([1, 8], [-0.5, -0.1], [{1: -0.5}, {8: -0.1, 2: -4.0}])
    v = outputs.compare(ref, got, 2, TOL)
    assert not v.ok
    assert v.diverged_at == 1
    assert "reference token at -4.0000" in v.detail


def test_empty_and_truncated_completions_fail() -> None:
    ref = sample([1, 2, 3])
    assert outputs.compare(ref, sample([]), 3, SAME).detail == "no tokens came back"
    v = outputs.compare(ref, sample([1, 2]), 3, SAME)
    assert not v.ok
    assert v.diverged_at == 2
    assert "2 of 3" in v.detail


def test_expectation_is_identical_only_for_one_tp_on_one_hardware() -> None:
    assert SAME.mode == "identical"
    assert SAME.tolerance == outputs.IDENTICAL_TOLERANCE
    assert TOL.mode == "tolerance"
    assert "TP 2 on the reference, 1 on decode" in TOL.reason
    assert outputs.expectation(1, {1}, {"a2", "a3"}).mode == "tolerance"


def _report(exp: Expectation, verdicts: list[Verdict]) -> OutputReport:
    r = OutputReport(16, exp)
    r.outcomes = [Outcome(i, "prefill-0", "prefill-0 -> decode-1", v, "ab", "cd")
                  for i, v in enumerate(verdicts)]  # fmt: skip
    return r


def test_summary_line_says_how_many_and_how() -> None:
    ok = Verdict(True, 16)
    assert _report(SAME, [ok] * 4).summary() == "outputs: 4/4 identical (first 16 tokens)"
    tol = _report(TOL, [ok] * 4).summary()
    assert tol.startswith("outputs: 4/4 within logprob tolerance 0.5 (TP 2 on the reference")
    bad = _report(SAME, [ok, Verdict(False, 4, 3, "expected token 3, got 9")] + [ok] * 2)
    assert bad.summary() == "outputs: FAILED: 3/4 identical (first 16 tokens)"
    (problem,) = bad.problems("canary")
    assert "prompt 2 through prefill-0 -> decode-1 diverges from prefill-0 alone" in problem
    assert "at token 3: expected token 3, got 9" in problem
    d = bad.to_dict()
    assert d["ok"] is False
    assert d["prompts"][1]["diverged_at"] == 3
    assert d["mode"] == "identical"


def test_a_request_that_failed_counts_against_the_check() -> None:
    r = _report(SAME, [Verdict(True, 16)] * 3)
    r.errors.append("prompt 4: through http://p failed: HTTP 500")
    assert not r.ok
    assert r.summary() == "outputs: FAILED: 3/4 identical (first 16 tokens)"


# -- empty and truncated phases (vllm bench serve's saved result) ----------------------------


def test_zero_token_requests_fail_the_phase_with_the_count() -> None:
    raw = {"output_lens": [8, 0, 0, 8], "errors": ["", "", "", ""]}
    (p,) = lengths.problems("phase run", raw, output_len=8, ignore_eos=False)
    assert p.startswith("phase run: 2 of 4 successful requests returned zero tokens")


def test_short_requests_fail_only_with_ignore_eos() -> None:
    raw = {"output_lens": [8, 3, 5, 8], "errors": ["", "", "", ""]}
    (p,) = lengths.problems("w", raw, output_len=8, ignore_eos=True)
    assert "2 of 4 successful requests returned fewer than 8 tokens" in p
    assert "shortest 3" in p
    assert lengths.problems("w", raw, output_len=8, ignore_eos=False) == []


def test_failed_requests_are_not_counted_as_empty() -> None:
    raw = {"output_lens": [8, 0], "errors": ["", "HTTP 500"]}
    assert lengths.problems("w", raw, output_len=8, ignore_eos=True) == []


def test_without_per_request_lengths_zero_total_tokens_fails() -> None:
    (p,) = lengths.problems("w", {"completed": 4, "total_output_tokens": 0}, output_len=8,
                            ignore_eos=True)  # fmt: skip
    assert "4 requests completed but 0 tokens" in p
    assert lengths.problems("w", {"output_lens": "junk"}, output_len=8, ignore_eos=True) == []


# -- orchestration (HTTP replaced by a function) ----------------------------------------------


def _plan():
    sets = ["proxy.port=47100", "prefill.port=47200", "decode.port=47300"]  # nothing listens
    return load_plan("local", sets=sets)


def test_run_sends_each_prompt_to_the_reference_and_through_the_proxy() -> None:
    plan = _plan()
    sent: list[tuple[str, dict]] = []

    def post(url: str, body: dict, *, timeout_s: float) -> dict:
        sent.append((url, body))
        if url == plan.proxy_url and len(sent) == 4:  # second prompt: decode got other KV
            return answer([1, 2, 7] + [4] * 13, [-1.0] * 16)
        return answer([1, 2, 3] + [4] * 13, [-1.0] * 16)

    counter = iter(range(100))
    report = output_check.run(
        plan, post, lambda: f"p{next(counter)}", TransportPool(plan.hosts), prompts=3
    )
    assert [u for u, _ in sent] == ["http://127.0.0.1:47200", plan.proxy_url] * 3
    body = sent[0][1]
    assert body["temperature"] == 0
    assert body["seed"] == 0
    assert body["max_tokens"] == 16
    assert body["logprobs"]
    assert body["return_tokens_as_token_ids"]
    assert body["ignore_eos"]
    assert "kv_transfer_params" not in body
    assert sent[0][1]["prompt"] == sent[1][1]["prompt"] != sent[2][1]["prompt"]
    assert report.summary() == "outputs: FAILED: 2/3 identical (first 16 tokens)"
    assert report.outcomes[1].verdict.diverged_at == 2


def test_run_reports_unreachable_engines_instead_of_raising() -> None:
    def post(url: str, body: dict, *, timeout_s: float) -> dict:
        raise OSError("connection refused")

    plan = _plan()
    report = output_check.run(plan, post, lambda: "p", TransportPool(plan.hosts), prompts=2)
    assert not report.ok
    assert len(report.errors) == 2
    assert "prefill-0 alone failed: connection refused" in report.errors[0]


def test_bench_default_is_on_for_cpu_and_rehearsals_and_restarted_scenarios() -> None:
    assert output_check.bench_default(_plan(), restarted=False)
    real = load_plan("ucm-mooncake-2p2d")
    assert not output_check.bench_default(real, restarted=False)
    assert output_check.bench_default(real, restarted=True)
    assert output_check.bench_default(load_plan("ucm-mooncake-2p2d", rehearse=True),
                                      restarted=False)  # fmt: skip


def test_tp_is_read_from_the_command_line() -> None:
    plan = load_plan("ucm-mooncake-2p2d")
    tps = {p.role: output_check.tp_of(p) for p in plan.processes if p.role in ("prefill", "decode")}
    assert all(v >= 1 for v in tps.values())
    ref = output_check.reference_process(plan)
    assert ref is not None
    assert ref.role == "prefill"


# -- the canary's verdict ---------------------------------------------------------------------


def _metrics_ok() -> canary.CanaryResult:
    d = Delta(per_target={"prefill-0": {"requests": 1.0},
                          "decode-0": {"requests": 1.0, "kv_received_tokens": 352.0}},
              roles={"prefill-0": "prefill", "decode-0": "decode"})  # fmt: skip
    return canary.judge(d, requests=1, generated=4, errors=[], disaggregated=True)


def test_canary_passes_only_when_outputs_pass_too() -> None:
    good = canary.with_outputs(_metrics_ok(), _report(SAME, [Verdict(True, 16)] * 4))
    assert good.ok
    assert good.line.endswith("; outputs: 4/4 identical (first 16 tokens)")
    assert good.to_dict()["outputs"]["ok"] is True
    bad = canary.with_outputs(_metrics_ok(), _report(SAME, [Verdict(False, 1, 0, "x")]))
    assert not bad.ok
    assert bad.line.startswith("canary FAILED: outputs: FAILED: 0/1 identical")
    assert "the /metrics proof passed (P→D KV handover verified: 352 tokens" in bad.problems[-1]


# -- the stand-in engine's fault injection mode -----------------------------------------------


@pytest.mark.parametrize("empty", [False, True])
def test_standin_engine_outputs_compare_equal_unless_empty(empty: bool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPD_FAULT_")}
    if empty:
        env["KVPD_FAULT_EMPTY_COMPLETIONS"] = "1"
    argv = [sys.executable, "-I", STANDIN_SCRIPT, "--host", "127.0.0.1", "--port", str(port),
            "--role", "mixed"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout
        assert "stand-in engine mixed" in proc.stdout.readline()
        b = output_check.body("standin", "a prompt " * 20, 16)
        here = LocalTransport(HostSpec("here", "127.0.0.1", transport="local"))
        got = outputs.parse_completion(canary.complete(here, f"http://127.0.0.1:{port}", b))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()
    if empty:
        assert got.token_ids == ()
        assert outputs.compare(got, got, 16, SAME).detail == "no tokens came back"
    else:
        assert len(got.token_ids) == 16
        assert outputs.compare(got, got, 16, SAME).ok


def test_canary_skips_the_output_check_when_its_request_failed(monkeypatch) -> None:
    def refuse(*a: object, **kw: object) -> None:
        raise AssertionError("the output check must not run")

    monkeypatch.setattr(output_check, "run", refuse)
    plan = _plan()
    r = canary.run(plan, TransportPool(plan.hosts), timeout_s=2)  # nothing listens there
    assert not r.ok
    assert r.outputs == {}
    assert "failed" in r.line


def test_a_check_under_live_traffic_compares_within_the_tolerance() -> None:
    plan = _plan()
    ref = output_check.reference_process(plan)
    assert ref is not None
    assert output_check.expectation_for(plan, ref).mode == "identical"
    live = output_check.expectation_for(plan, ref, live=True)
    assert live.mode == "tolerance"
    assert live.reason == "live traffic shares batches"
