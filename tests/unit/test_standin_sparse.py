"""The stand-in decode with sparse KV offload (kvpd/testing/standin_sparse.py): it runs the
planner the plan chose, kvpd's native core, for every request and says so on /metrics; it does
not start when that planner cannot load. And the plan side: `rehearsal.standin_python` gives
one host's stand-ins their own Python, and that host's engine slot of the node bundle follows."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kvpd.errors import ProfileError
from kvpd.plan.build import load_plan
from tests.unit.test_rehearse import _free_port, _post

PROFILE = "layerwise-sparse-1p1d"
ARM = "/opt/arm64/bin/python3.11"


def _decode_argv(port: int, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The plan's stand-in decode of PROFILE on loopback (no held ports), and its planner env."""
    p = load_plan(PROFILE, rehearse="standin").process("decode-0")
    argv, i = [python], 1
    while i < len(p.command):
        if p.command[i] == "--hold-port":
            i += 2
            continue
        argv.append(p.command[i])
        i += 1
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    return argv, {k: v for k, v in p.env if k == "KVPD_SPARSE_PLANNER"}


def _metrics(port: int) -> dict[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        rows = r.read().decode().splitlines()
    return {ln.rpartition(" ")[0]: ln.rpartition(" ")[2] for ln in rows if ln.startswith("kvpd:")}


def _value(rows: dict[str, str], name: str) -> float:
    return sum(float(v) for k, v in rows.items() if k.startswith(name + "{"))


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    environ.pop("KVPD_NATIVE_ISA", None)
    return subprocess.Popen(
        argv, env={**environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_listening(proc: subprocess.Popen[str], port: int) -> list[str]:
    """The stand-in's start lines, up to the one it prints when it serves."""
    lines = []
    assert proc.stdout is not None
    while not (lines and "standing in for" in lines[-1]):
        line = proc.stdout.readline()
        assert line, (
            f"the stand-in exited: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}"
        )
        lines.append(line)
    socket.create_connection(("127.0.0.1", port), timeout=10).close()
    return lines


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    for f in (proc.stdout, proc.stderr):
        if f:
            f.close()


def test_one_hosts_standins_run_with_its_python_and_its_engine_slot_follows() -> None:
    plan = load_plan(PROFILE, rehearse="standin", sets=[f"rehearsal.standin_python.d1={ARM}"])
    assert plan.process("decode-0").command[0] == ARM
    assert plan.process("prefill-0").command[0] == "python3"  # rehearsal.python elsewhere
    slots = {(u.host, u.slot): u for u in plan.bundle}
    assert slots[("d1", "engine")].python == ARM
    assert slots[("d1", "engine")].native == "preferred"  # decode.sparse_offload.planner: auto
    decode = plan.process("decode-0").command
    at = decode.index("--sparse-topk")
    assert decode[at : at + 4] == ("--sparse-topk", "2048", "--sparse-token-bytes", "1024,128")
    assert "--sparse-topk" not in plan.process("prefill-0").command
    # CPU vLLM in the rehearsal, and the real deployment: the engine slot is vLLM's Python.
    for rehearse in (True, False):
        uses = load_plan(PROFILE, rehearse=rehearse).bundle
        assert next(u for u in uses if u.slot == "engine").python.startswith("@")


def test_standin_python_of_an_unknown_host_is_refused_with_the_hosts() -> None:
    with pytest.raises(ProfileError) as e:
        load_plan(PROFILE, rehearse="standin", sets=[f"rehearsal.standin_python.d2={ARM}"])
    assert "rehearsal.standin_python.d2: unknown host 'd2'. Did you mean 'd1'?" in str(e.value)


def test_the_standin_decode_plans_every_request_with_kvpds_native_planner() -> None:
    ap = pytest.importorskip("kvpd.native.ascend_planner", reason="kvpd's native core is not built")
    port = _free_port()
    argv, env = _decode_argv(port)
    assert env == {"KVPD_SPARSE_PLANNER": "kvpd"}
    proc = _start(argv, env)
    try:
        start = _wait_listening(proc, port)
        isa = ap.isa_info()["isa"]
        assert f"kvpd's native core ({isa} row planner" in start[0], start
        prompts, out = (30, 50), 3  # tokens ("abcd" is one), tokens generated
        for n in prompts:
            body = _post(f"http://127.0.0.1:{port}/v1/completions",
                         {"prompt": "abcd" * n, "max_tokens": out})  # fmt: skip
            assert body["usage"]["completion_tokens"] == out
        rows = _metrics(port)
        info = next(k for k in rows if k.startswith("kvpd:sparse_planner_info{"))
        assert f'planner="kvpd",isa="{isa}"' in info, info
        assert "_ascend_planner" in info, info
        assert _value(rows, "kvpd:sparse_planner_requests_total") == len(prompts)
        assert _value(rows, "kvpd:sparse_planner_steps_total") == len(prompts) * out
        # Sliding top-k window (index_topk 2048 > context): the first step loads the whole
        # context, each later one the newest token; every load is a K and a V descriptor.
        loaded = sum(n + out - 1 for n in prompts)
        assert _value(rows, "kvpd:sparse_planner_loaded_tokens_total") == loaded
        assert _value(rows, "kvpd:sparse_planner_copy_descriptors_total") == 2 * loaded
    finally:
        _stop(proc)


def test_the_standin_decode_does_not_start_without_the_planner(tmp_path: Path) -> None:
    # A kvpd without the native core first on the path: what a bundle without it gives.
    (tmp_path / "kvpd" / "native").mkdir(parents=True)
    (tmp_path / "kvpd" / "__init__.py").write_text("")
    (tmp_path / "kvpd" / "native" / "__init__.py").write_text("")
    port = _free_port()
    argv, env = _decode_argv(port)
    proc = _start(argv, {**env, "PYTHONPATH": str(tmp_path)})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert (
        "cannot start: the plan runs kvpd's sparse planner here (KVPD_SPARSE_PLANNER=kvpd)" in err
    )
    assert "cannot import it" in err
    assert "decode.sparse_offload.planner: upstream" in err
    assert "Traceback" not in err


def test_the_standin_decode_with_upstreams_planner_says_so_and_plans_nothing() -> None:
    port = _free_port()
    argv, _ = _decode_argv(port)
    proc = _start(argv, {"KVPD_SPARSE_PLANNER": "upstream"})
    try:
        start = _wait_listening(proc, port)
        assert "vLLM-Ascend's own (KVPD_SPARSE_PLANNER=upstream)" in start[0], start
        _post(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "abcd", "max_tokens": 2})
        rows = _metrics(port)
        assert any('planner="upstream"' in k for k in rows), rows
        assert _value(rows, "kvpd:sparse_planner_requests_total") == 0
    finally:
        _stop(proc)


def test_the_planner_reads_the_real_command_lines_sparse_settings() -> None:
    from kvpd.testing import standin_sparse as s

    real = ["vllm", "serve", "/m", "--max-model-len", "4096", "--max-num-seqs", "4",
            "--additional-config", json.dumps({"sparse_kv_offload_config": {
                "enabled": True, "topk_buffer_size": 512}})]  # fmt: skip
    cfg = s.configured(real)
    assert cfg is not None
    assert s.spec_of(real, cfg, 256, "1024,128", 128) == s.Spec(256, 512, 4, 4096, 128, 1024, 128)
    off = json.dumps({"sparse_kv_offload_config": {"enabled": False}})
    assert s.configured(["vllm", "serve", "--additional-config", off]) is None
    assert s.configured(["vllm", "serve", "--additional-config", "{not json"]) is None
