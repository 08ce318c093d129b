"""Rehearsal as one transform of the real deployment's processes (kvpd/plan/rehearse.py), and
the stand-in engine it can put in place of each engine (kvpd/testing/standin_engine.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

import pytest

from kvpd.bench.metrics import _ENGINE_COUNTERS
from kvpd.errors import KvpdError
from kvpd.plan.build import load_plan
from kvpd.plan.rehearsal_engines import STANDIN_SCRIPT

ENGINES = ("prefill", "decode", "mixed")


def test_standin_keeps_the_real_topology_command_environment_and_ports() -> None:
    real = load_plan("large-ep", base_dir="/srv")
    rh = load_plan("large-ep", rehearse="standin", base_dir="/srv")
    assert [(p.name, p.host, p.stage) for p in rh.processes] == [
        (p.name, p.host, p.stage) for p in real.processes
    ]
    for p in rh.processes:
        r = real.process(p.name)
        if p.role in ENGINES:
            assert p.command[1] == STANDIN_SCRIPT
            assert "stand-in" in p.substituted
            assert p.command[p.command.index("--") + 1 :] == r.command
            assert p.env == r.env
            assert p.ports == r.ports
    assert rh.ports == real.ports
    proxy = rh.process("proxy").command
    assert proxy.count("9000") + proxy.count("9001") == 12  # fans out to all 12 engines


def test_default_rehearsal_is_cpu_vllm() -> None:
    assert load_plan("large-ep", rehearse=True) == load_plan("large-ep", rehearse="vllm")
    p = load_plan("large-ep", rehearse=True).process("decode-dp3")
    assert "serve" in p.command
    assert "ExampleConnector" in p.substituted


def test_findings_about_the_real_hardware_do_not_apply_to_a_rehearsal() -> None:
    assert any("random ports" in w for w in load_plan("large-ep").warnings)
    for engine in ("vllm", "standin"):
        assert not any("random ports" in w for w in load_plan("large-ep", rehearse=engine).warnings)


def test_unknown_rehearsal_engine_names_the_choices() -> None:
    with pytest.raises(
        KvpdError, match="unknown rehearsal engine 'gpu'; use one of: vllm, standin"
    ):
        load_plan("large-ep", rehearse="gpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_standin_engine_speaks_the_pd_handshake_and_vllm_metrics() -> None:
    port, held = _free_port(), _free_port()
    argv = [sys.executable, "-I", STANDIN_SCRIPT, "--host", "127.0.0.1", "--port", str(port),
            "--role", "decode", "--block-size", "4", "--hold-port", str(held),
            "--", "vllm", "serve", "/m", "--served-model-name", "m1"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)  # -I: no kvpd on the path
    try:
        assert "stand-in engine decode" in (proc.stdout.readline() if proc.stdout else "")
        base = f"http://127.0.0.1:{port}"
        socket.create_connection(("127.0.0.1", held), timeout=5).close()  # the held port listens
        prompt = "abcd" * 10  # 10 pseudo-tokens: 2 whole blocks of 4
        kv = {"do_remote_prefill": True, "remote_engine_id": "p"}
        body = _post(base + "/v1/completions", {"prompt": prompt, "max_tokens": 3,
                                                "kv_transfer_params": kv})  # fmt: skip
        assert body["model"] == "m1"
        assert body["usage"]["completion_tokens"] == 3
        _post(base + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        rows = text.splitlines()
        for name, labels in _ENGINE_COUNTERS.values():  # every counter kvpd's proof reads
            want = [f'{k}="{v}"' for k, v in labels.items()]
            assert any(r.startswith(name + "{") and all(w in r for w in want) for r in rows), name
        assert 'source="external_kv_transfer"} 10' in text
        assert "vllm:prefix_cache_hits_total" in text
        assert 'source="local_cache_hit"} 8' in text
    finally:
        proc.terminate()  # SIGTERM: the stand-in shuts its server down and exits
        assert proc.wait(timeout=10) == 0
        if proc.stdout:
            proc.stdout.close()


def test_cpu_rehearsal_keeps_a_whole_dp_process_data_parallel() -> None:
    mixed = load_plan("ucm-pd-mixed", rehearse=True).process("mixed-0")
    assert mixed.command[mixed.command.index("--data-parallel-size") + 1] == "2"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in dict(mixed.env)  # DP ranks are processes
    per_rank = load_plan("large-ep", rehearse=True).process("decode-dp3")  # one rank each
    assert "--data-parallel-size" not in per_rank.command
