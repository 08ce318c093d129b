"""Proof of disaggregation: runs whose decode received no KV (or whose external scenario never
hit the store) are failures, from deltas and /metrics captured on real engines."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvpd.bench import proof, runner
from kvpd.bench.metrics import Delta
from kvpd.bench.session import Session
from kvpd.bench.settings import make_settings
from kvpd.exec.service import Deployments
from kvpd.exec.state import StateStore
from kvpd.plan.bench import bench_spec
from kvpd.plan.value import HealthCheck, HostSpec, Plan, ProcessSpec
from kvpd.profile.schema import Bench

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


def _delta(name: str, phase: str) -> Delta:
    d = json.loads((FIX / name).read_text())[phase]
    return Delta(per_target=d["per_target"], roles=d["roles"])


def _check(delta: Delta, **kw: object) -> list[str]:
    args: dict = dict(scenario="as-is", phase="run", measured=True, protocol="plain",
                      disaggregated=True, cache=None,
                      result={"completed": 20, "failed": 0}, delta=delta)  # fmt: skip
    args.update(kw)
    return proof.check_phase(**args)


def test_real_pd_run_passes_both_phases() -> None:
    """ExampleConnector P/D, prefix protocol: the seed phase moved 1824 tokens to decode; in
    the measured phase decode found the prefixes in its own cache (no transfer needed)."""
    assert _check(_delta("pd_deltas.json", "seed"), phase="seed", measured=False) == []
    assert _check(_delta("pd_deltas.json", "measured"), phase="measured", protocol="prefix") == []


def test_decode_that_received_no_kv_is_a_failure() -> None:
    """Captured from a real deployment whose decode read KV from the wrong folder."""
    (problem,) = _check(_delta("pd_broken_decode_deltas.json", "run"))
    assert "decode received no KV" in problem
    assert "2472 prompt tokens themselves" in problem
    assert "kvpd logs decode-0" in problem
    # the same numbers on a deployment without P/D are fine
    assert _check(_delta("pd_broken_decode_deltas.json", "run"), disaggregated=False) == []


def test_unreachable_decode_metrics_or_idle_decode_fail() -> None:
    d = _delta("pd_deltas.json", "measured")
    d.missing["decode-0"] = "http://x/metrics: connection refused"
    del d.per_target["decode-0"]
    assert "cannot prove disaggregation" in _check(d)[0]
    idle = _delta("pd_deltas.json", "measured")
    idle.per_target["decode-0"] = {k: 0.0 for k in idle.per_target["decode-0"]}
    assert "served no request" in _check(idle)[0]


def test_external_scenario_without_external_hits_fails() -> None:
    d = _delta("pd_deltas.json", "measured")
    kw = dict(scenario="any-name", phase="measured", protocol="prefix", cache="external")
    (problem,) = _check(d, **kw)
    assert "zero external prefix-cache hits" in problem
    # decode's external hits are the P->D handoff, not store hits: they do not count
    d.per_target["decode-0"]["external_prefix_cache_hits"] = 500.0
    assert _check(d, **kw)
    d.per_target["prefill-0"]["external_prefix_cache_hits"] = 96.0
    assert _check(d, **kw) == []
    # seeding and cold phases are not expected to hit
    assert _check(_delta("pd_deltas.json", "seed"), **{**kw, "phase": "seed"}) == []


def test_recompute_and_hbm_caches_are_checked_whatever_the_name() -> None:
    """cache: none -> zero HBM and zero external hits; hbm -> zero external hits; in every
    phase, by the scenario's cache and never by its name."""
    d = _delta("pd_deltas.json", "measured")
    for k in d.per_target:
        d.per_target[k]["prefix_cache_hits"] = 0.0
        d.per_target[k]["external_prefix_cache_hits"] = 0.0
    assert _check(d, scenario="ucm-looks-external", cache="none") == []
    d.per_target["decode-0"]["prefix_cache_hits"] = 32.0
    (problem,) = _check(d, scenario="x", cache="none", phase="seed", measured=False)
    assert "32 vLLM prefix-cache hits" in problem
    assert "enable_prefix_caching=false" in problem
    assert _check(d, scenario="x", cache="hbm") == []
    d.per_target["prefill-0"]["external_prefix_cache_hits"] = 64.0
    (problem,) = _check(d, scenario="x", cache="hbm")
    assert "64 external prefix-cache hits" in problem
    assert "`without`" in problem
    assert len(_check(d, scenario="x", cache="none")) == 2
    # decode's external hits are the P->D handoff: never a store hit
    d.per_target["prefill-0"]["external_prefix_cache_hits"] = 0.0
    d.per_target["decode-0"]["prefix_cache_hits"] = 0.0
    d.per_target["decode-0"]["external_prefix_cache_hits"] = 500.0
    assert _check(d, scenario="x", cache="none") == []


def test_hit_ratio_is_checked_against_the_protocol() -> None:
    """The real P/D capture: 5% cached while seeding, 75% in the measured phase of the prefix
    protocol (0.8). A re-run whose caches still hold the prompts shows ~100% (measured) or the
    measured ratio in a cold phase: contaminated, a failure, whatever the scenario's cache."""
    seed, measured = _delta("pd_deltas.json", "seed"), _delta("pd_deltas.json", "measured")
    assert _check(seed, phase="seed", protocol="prefix", measured=False) == []
    assert _check(measured, phase="measured", protocol="prefix") == []
    for protocol, phase in (("prefix", "seed"), ("twice", "cold"), ("plain", "run")):
        (problem,) = _check(measured, phase=phase, protocol=protocol)
        assert "75% of the prompt tokens on the prefill/mixed engines were cached" in problem
        assert "expects none" in problem
        assert "contaminated" in problem
    assert _check(measured, phase="warm", protocol="twice") == []  # warm may hit everything
    # vllm bench serve's test request repeats the first prompt: with few prompts that prompt's
    # hits are allowed (here: 4 prompts of 128 tokens, 2 of them hit in full, 50%)
    few = _delta("pd_deltas.json", "seed")
    few.per_target["prefill-0"].update(prefix_cache_queries=512.0, prefix_cache_hits=240.0)
    assert _check(few, phase="seed", protocol="prefix", measured=False, input_len=128) == []
    assert _check(few, phase="seed", protocol="prefix", measured=False, input_len=0)
    rerun = _delta("pd_deltas.json", "measured")
    rerun.per_target["prefill-0"]["prefix_cache_hits"] = 2048.0
    rerun.per_target["prefill-0"]["external_prefix_cache_hits"] = 480.0
    (problem,) = _check(rerun, phase="measured", protocol="prefix", cache="external")
    assert "98% of the prompt tokens" in problem
    assert "expects about 0.8" in problem


def test_failed_requests_fail() -> None:
    probs = _check(_delta("pd_deltas.json", "measured"), result={"completed": 0, "failed": 20})
    assert any("20 of 20 requests failed" in p for p in probs)


class _MetricsServer:
    """Serves /health and, per GET /metrics, the next of a list of captured texts."""

    def __init__(self, texts: list[str]) -> None:
        texts = list(texts)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b""
                if self.path == "/metrics":
                    body = (texts.pop(0) if len(texts) > 1 else texts[0]).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def _plan(ports: dict[str, int]) -> Plan:
    def proc(name: str, role: str) -> ProcessSpec:
        url = f"http://127.0.0.1:{ports[name]}/health"
        return ProcessSpec(name, "h", role, 0, "s", ("x",), health=HealthCheck(url))

    return Plan(
        deployment="fake-pd", profile_digest="d", hosts=(HostSpec("h", "127.0.0.1", "local"),),
        files=(), processes=(proc("prefill-0", "prefill"), proc("decode-0", "decode"),
                             proc("proxy", "proxy")),
        proxy_url=f"http://127.0.0.1:{ports['proxy']}", served_model="tiny", tokenizer="",
        bench=bench_spec(Bench(input_len=128, output_len=16, num_prompts=20, seed=0,
                               max_concurrency=4)),
    )  # fmt: skip


def _fake_client(stem: str):
    """Stands in for `vllm bench serve`: saves a result captured from the real client."""

    def run(argv: list[str], *, env: dict, log: Path, timeout_s: float) -> runner.RunOutput:
        out_dir = Path(argv[argv.index("--result-dir") + 1])
        name = argv[argv.index("--result-filename") + 1]
        (out_dir / name).write_text((FIX / f"{stem}.json").read_text())
        stdout = (FIX / f"{stem}.stdout.txt").read_text()
        log.write_text(stdout)
        return runner.RunOutput(argv, 0, stdout, str(log), 0.0)

    return run


@pytest.mark.parametrize(
    ("decode_texts", "ok"),
    [
        (["metrics_pd_decode_before.txt", "metrics_pd_decode_after.txt"], True),
        # a decode that computed its prompts itself: real engine counters, no KV received
        (["metrics_single_before.txt", "metrics_single_mid.txt"], False),
    ],
)
def test_session_fails_when_decode_receives_no_kv(
    tmp_path: Path, decode_texts: list[str], ok: bool
) -> None:
    read = lambda n: (FIX / n).read_text()  # noqa: E731
    servers = {
        # the prefill capture spans a whole prefix run (seed + measured: 44% cached), which a
        # plain run would rightly call contaminated; this test is about decode's counters
        "prefill-0": _MetricsServer([read("metrics_pd_prefill_before.txt")]),
        "decode-0": _MetricsServer([read(n) for n in decode_texts]),
        "proxy": _MetricsServer([read("metrics_pd_proxy_before.txt"),
                                 read("metrics_pd_proxy_after.txt")]),
    }  # fmt: skip
    try:
        plan = _plan({k: s.port for k, s in servers.items()})
        session = Session(
            profile="fake-pd",
            settings=make_settings(plan.bench),
            scenarios=[],
            out_dir=tmp_path / "out",
            service=Deployments(StateStore(tmp_path / "state")),
            load=lambda sets: plan,
            vllm="vllm",
            run_client=_fake_client("seed"),
            verify_outputs=False,  # these engines serve /metrics only
        )
        run = session.run()
    finally:
        for s in servers.values():
            s.close()
    (rec,) = run.records
    assert rec.result["completed"] == 20
    assert run.ok is ok
    if not ok:
        assert "decode received no KV" in run.problems[0]


def test_every_run_and_sweep_point_gets_prompts_no_cache_has_seen(tmp_path: Path) -> None:
    """Re-runs with the profile's seed would find their prompts in the caches an earlier run
    filled; each run (and each scenario and sweep point) draws its own seed, and the phases of
    one protocol share theirs (the prefix protocol's seeding and measured phases)."""
    servers = {n: _MetricsServer(["vllm:request_success_total 0\n"])
               for n in ("prefill-0", "decode-0", "proxy")}  # fmt: skip
    seeds: list[list[int]] = []
    try:
        plan = _plan({k: s.port for k, s in servers.items()})
        for _ in range(2):
            used: list[int] = []

            def client(argv: list[str], used: list[int] = used, **kw: object) -> runner.RunOutput:
                used.append(int(argv[argv.index("--seed") + 1]))
                return _fake_client("seed")(argv, **kw)

            settings = make_settings(plan.bench, protocol="prefix", input_lens=[128, 256])
            run = Session(
                profile="fake-pd", settings=settings, scenarios=[], out_dir=tmp_path / "out",
                service=Deployments(StateStore(tmp_path / "state")), load=lambda sets: plan,
                vllm="vllm", run_client=client,
            ).run()  # fmt: skip
            assert sorted(run.settings["prompt_seeds"].values()) == sorted(set(used))
            seeds.append(used)
    finally:
        for s in servers.values():
            s.close()
    for used in seeds:  # seed, measured per point: shared within a point, not across points
        assert len(used) == 4
        assert used[0] == used[1]
        assert used[2] == used[3] != used[0]
    assert not set(seeds[0]) & set(seeds[1])  # a re-run never repeats the earlier prompts
