"""The canary's verdict (pure, from deltas) and the append-only event log."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kvpd.bench import canary
from kvpd.bench.metrics import Delta
from kvpd.exec.events import EventLog

ROLES = {"prefill-0": "prefill", "decode-0": "decode", "proxy": "proxy"}


def _delta(prefill: dict, decode: dict) -> Delta:
    return Delta(per_target={"prefill-0": prefill, "decode-0": decode, "proxy": {}}, roles=ROLES)


def test_handover_line_names_tokens_and_processes() -> None:
    d = _delta(
        {"requests": 1}, {"requests": 1, "kv_received_tokens": 96, "local_compute_tokens": 1}
    )
    r = canary.judge(d, requests=1, generated=4, errors=[], disaggregated=True)
    assert r.ok
    assert r.line == "P→D KV handover verified: 96 tokens from prefill-0 to decode-0"


def test_no_kv_received_names_the_counter() -> None:
    d = _delta({"requests": 1}, {"requests": 1, "local_compute_tokens": 96})
    r = canary.judge(d, requests=1, generated=4, errors=[], disaggregated=True)
    assert not r.ok
    assert 'source="external_kv_transfer"' in r.line
    assert "decode received no KV" in r.line


def test_prefill_not_counting_names_prefill() -> None:
    d = _delta({}, {"requests": 1, "kv_received_tokens": 96})
    r = canary.judge(d, requests=1, generated=4, errors=[], disaggregated=True)
    assert not r.ok
    assert "vllm:request_success_total did not move on prefill-0" in r.problems[0]


def test_request_error_and_no_tokens() -> None:
    d = _delta({}, {})
    r = canary.judge(d, requests=1, generated=0, errors=["POST x failed: refused"],
                     disaggregated=True)  # fmt: skip
    assert not r.ok
    assert r.problems[0] == "POST x failed: refused"


def test_mixed_one_request_per_instance() -> None:
    roles = {"mixed-0": "mixed", "mixed-1": "mixed"}
    d = Delta(per_target={"mixed-0": {"requests": 1}, "mixed-1": {}}, roles=roles)
    r = canary.judge(d, requests=2, generated=8, errors=[], disaggregated=False)
    assert not r.ok
    assert "grew by 1" in r.line
    d.per_target["mixed-1"] = {"requests": 1}
    assert canary.judge(d, requests=2, generated=8, errors=[], disaggregated=False).ok


def test_prompts_differ() -> None:
    assert canary.prompt() != canary.prompt()


def test_event_log_appends_private_lines(tmp_path: Path) -> None:
    log = EventLog(tmp_path, "dep")
    log.record("up", "3 processes", profile="local")
    log.record("canary", "ok", ok=True)
    with open(log.path, "a") as f:
        f.write("torn {\n")
    log.record("down", "clean")
    events = log.read()
    assert [e.what for e in events] == ["up", "canary", "down"]
    assert events[0].data == {"profile": "local"}
    assert "@" in events[0].who
    assert stat.S_IMODE(os.stat(log.path).st_mode) == 0o600
    assert [e.what for e in log.read(last=1)] == ["down"]


def test_layerwise_needs_the_metaserver_path() -> None:
    d = _delta({"requests": 1}, {"requests": 1, "kv_received_tokens": 96})
    r = canary.judge(d, requests=1, generated=4, errors=[], disaggregated=True, layerwise=True)
    assert not r.ok
    assert "/v1/metaserver" in r.line
    d.per_target["proxy"] = {"disaggregated": 1}
    assert canary.judge(d, requests=1, generated=4, errors=[], disaggregated=True,
                        layerwise=True).ok  # fmt: skip


def test_supervisor_restarts_reach_the_event_log_once(tmp_path: Path) -> None:
    from kvpd.exec.events import note_restarts

    log = EventLog(tmp_path, "dep")
    log.record("up")
    note_restarts(log, "decode-0", 0, "")
    note_restarts(log, "decode-0", 1, "signal SIGKILL")
    note_restarts(log, "decode-0", 1, "signal SIGKILL")  # seen again by a later `status`
    assert [e.what for e in log.read()] == ["up", "supervisor-restart"]
    log.record("up")  # a new start: its supervisor counts from 0 again
    note_restarts(log, "decode-0", 1, "code 1")
    assert [e.what for e in log.read()][-1] == "supervisor-restart"
