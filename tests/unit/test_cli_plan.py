"""`kvpd plan` and `kvpd schema` through the real CLI: exit codes, messages, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def kvpd(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvpd.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plan_bundled_profile_shows_processes_and_order() -> None:
    r = kvpd("plan", "ucm-centralized-2p2d")
    assert r.returncode == 0, r.stderr
    for word in ("prefill-1", "decode-1", "proxy", "start order", "7805"):
        assert word in r.stdout


def test_plan_json_is_the_plan() -> None:
    r = kvpd("plan", "large-ep", "--json")
    plan = json.loads(r.stdout)
    assert plan["deployment"] == "large-ep"
    assert len([p for p in plan["processes"] if p["role"] == "decode"]) == 8


def test_plan_out_writes_one_folder_per_host(tmp_path: Path) -> None:
    r = kvpd("plan", "layerwise-sparse-1p1d", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p1" / "conf" / "mmc-meta.conf").is_file()
    assert (tmp_path / "d1" / "decode-0" / "launch.sh").is_file()
    assert json.loads((tmp_path / "plan.json").read_text())["deployment"]


def test_bad_profile_exits_2_with_located_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nhosts:\n  h1: {address: 10.0.0.1}\nmodel:\n  path: /m\nprefil:\n  hosts: [h1]\n"
    )
    r = kvpd("plan", str(bad))
    assert r.returncode == 2
    assert f"{bad}:6: prefil: unknown field 'prefil'. Did you mean 'prefill'?" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_rule_violation_exits_2(tmp_path: Path) -> None:
    r = kvpd("plan", "layerwise-sparse-1p1d", "--set", "decode.sparse_offload.topk_buffer_size=100")
    assert r.returncode == 2
    assert "decode.sparse_offload.topk_buffer_size: 100 is smaller than index_topk 2048" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_profile_names_the_bundled_ones() -> None:
    r = kvpd("plan", "nope")
    assert r.returncode == 2
    assert "Bundled profiles:" in r.stderr


def test_schema_is_json_schema() -> None:
    r = kvpd("schema")
    schema = json.loads(r.stdout)
    assert "prefill" in schema["properties"]
    assert schema["additionalProperties"] is False


def test_plan_rehearse_shows_substitutions() -> None:
    r = kvpd("plan", "layerwise-sparse-1p1d", "--rehearse")
    assert r.returncode == 0, r.stderr
    assert "substituted" in r.stdout
    assert "MetaService" in r.stdout


def test_import_kvpd_core_is_light() -> None:
    code = (
        "import sys, kvpd, kvpd.plan.build; "
        "print(sorted(m for m in ('typer','rich','paramiko') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_plan_shows_sparse_offload_sizing() -> None:
    r = kvpd("plan", "layerwise-sparse-1p1d")
    assert "sparse offload sizing" in r.stdout
    assert "<- profile" in r.stdout
    assert "recommended:" in r.stdout


def test_plan_with_inventory_overlay(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "hosts:\n  p1: {address: 10.9.9.1}\n  d1: {address: 10.9.9.2}\n"
        "ssh: {user: deploy, port: 2222}\n"
    )
    r = kvpd("plan", "ucm-centralized-2p2d", "--inventory", str(inv), "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    hosts = {h["name"]: h for h in plan["hosts"]}
    assert hosts["p1"]["address"] == "10.9.9.1"
    assert hosts["d1"]["user"] == "deploy"
    assert hosts["d1"]["port"] == 2222
    assert plan["proxy_url"] == "http://10.9.9.1:7805"


def test_a_missing_command_module_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpd.cli import main

    monkeypatch.setattr(main, "_COMMAND_MODULES", ("kvpd.cli.plan_cmd", "kvpd.cli.no_such_cmd"))
    with pytest.raises(ModuleNotFoundError, match="no_such_cmd"):
        main.build_app()


def test_plan_table_port_column_keeps_unrelated_ports_apart() -> None:
    """large-ep's prefill rank 0 has HTTP 9000, Mooncake 20001-20008 and the DP RPC port 13395:
    three things, never one range `20001-13395`."""
    from kvpd.cli.plan_cmd import _ports_short

    assert _ports_short((9000, *range(20001, 20009), 13395)) == ["9000", "20001-20008", "13395"]
    assert _ports_short((50088, 9003)) == ["50088", "9003"]
    assert _ports_short(()) == []
    out = kvpd("plan", "large-ep").stdout
    assert "20001-13395" not in out
    assert "20001-20008" in out


def test_strict_fails_on_warnings_for_ci() -> None:
    r = kvpd("plan", "large-ep", "--strict")
    assert r.returncode == 1
    assert "warning" in r.stdout
    assert "--strict: the plan has 3 warning(s)" in r.stderr
    assert kvpd("plan", "ucm-centralized-2p2d", "--strict").returncode == 0


def test_plan_shows_each_hosts_ssh_route_and_run_dir(tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host 192.168.10.2\n  ProxyJump ops@bastion:2222\n")
    r = subprocess.run(
        [sys.executable, "-m", "kvpd.cli.main", "plan", "ucm-centralized-2p2d",
         "--set", "hosts.p1.ssh={jump: me@gw, jump_key: /keys/me}", "--set", "ssh.user=sre"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "KVPD_SSH_CONFIG": str(cfg)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "p1: through jump host me@gw:22 (key /keys/me) to sre@192.168.10.1:22" in out
    assert "d1: through jump host ops@bastion:2222 to sre@192.168.10.2:22" in out
    assert "relative paths are in its run dir .kvpd/ucm-centralized-2p2d/run under the login" in out


def test_plan_prints_every_derived_size_with_its_inputs() -> None:
    r = kvpd("plan", "layerwise-sparse-1p1d", "--set", "kv.memcache.dram_size=auto")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert (
        "kv.memcache.dram_size auto: 89856 B a token x 32768 tokens (model.max_model_len) x 16"
        in out
    )
    assert "(prefill 1 instance(s) x dp 1 x max_num_seqs 16) / 16 LocalService ranks" in out
    assert "prefill-0 on p1: 16 dies 0-15 = 8 chips 0-7" in out
    assert "decode host pool: 128 GB a DP rank holds 46 sequences" in out


def test_schema_carries_the_field_descriptions_for_editors() -> None:
    group = json.loads(kvpd("schema").stdout)["$defs"]["Group"]["properties"]
    assert all(group[f].get("description") for f in ("tp", "dp", "instances", "kv_port"))


def test_readme_annotated_example_plans(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.yaml").write_text(block)
    r = kvpd("plan", str(tmp_path / "example.yaml"))
    assert r.returncode == 0, r.stderr
    assert "derived" in r.stdout


def test_an_inventory_may_not_override_what_is_served(tmp_path: Path) -> None:
    from kvpd.errors import ProfileError
    from kvpd.profile.load import load_inventory

    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  p1: {address: 10.9.9.1}\nengine:\n  args: [--trust-remote-code]\n")
    with pytest.raises(ProfileError) as e:
        load_inventory(str(inv))
    assert f"{inv}:3: engine: an inventory holds machine facts only (hosts, ssh, rehearsal)" in str(
        e.value
    )


def test_plan_shows_the_bench_protocol_and_its_commands() -> None:
    r = kvpd("plan", "ucm-pd-mixed")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())  # the console wraps long lines
    assert "bench: protocol twice (the same run twice, cold then warm, both measured)" in out
    assert "scenarios: recompute, hbm, ucm" in out
    for phase in ("cold", "warm"):
        assert f"{phase}: vllm bench serve --backend vllm --base-url" in out
    assert "--random-input-len 8000" in out
    assert "--seed '<SEED>'" in out
