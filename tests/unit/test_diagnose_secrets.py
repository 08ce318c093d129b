"""Diagnose archives: secrets masked by allow-list and by shape, a --shareable form without
topology, and the archive 0600 from its creation."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from kvpd.errors import ProfileError
from kvpd.exec import logs
from kvpd.exec.diagnose import gather
from kvpd.exec.diagnose.redact import env_text, scrub
from kvpd.exec.local import LocalTransport
from kvpd.exec.pool import TransportPool
from kvpd.exec.state import DeploymentState, ProcessRecord
from kvpd.plan.build import load_plan

SECRETS = ("hunter2", "hf_abcdefghijklmnopqrstuvwx", "s3cr3tpw", "sk-abcdefghijklmnopqrstu", "pw9")


@pytest.mark.parametrize(
    "text",
    [
        "DB_PASS=hunter2",
        "vllm serve /m --hf-token hf_abcdefghijklmnopqrstuvwx --port 8000",
        "vllm serve /m --api-key=sk-abcdefghijklmnopqrstu",
        "downloading https://alice:s3cr3tpw@mirror.example.com/model",
        "non-default args: {'model': '/m', 'api_key': 'pw9'}",
        "HF token in a message: hf_abcdefghijklmnopqrstuvwx",
        "Authorization: Bearer sk-abcdefghijklmnopqrstu",
    ],
)
def test_secret_shapes_are_masked_in_text(text: str) -> None:
    out = scrub(text)
    assert not any(s in out for s in SECRETS)
    assert "****" in out


def test_facts_that_are_no_secrets_stay() -> None:
    text = "--max-num-batched-tokens 8000 --tokenizer /m http://10.0.0.1:8000/health monkey=3"
    assert scrub(text) == text


def test_environment_values_are_shown_only_for_known_safe_names() -> None:
    env = "PATH=/usr/bin\0DB_PASS=hunter2\0MY_SETTING=pw9\0VLLM_API_KEY=x\0VLLM_PORT=1\0"
    assert env_text(env).splitlines() == [
        "DB_PASS=****",
        "MY_SETTING=****",
        "PATH=/usr/bin",
        "VLLM_API_KEY=****",
        "VLLM_PORT=1",
    ]


@pytest.mark.parametrize("flag", ["--hf-token", "--hf_token=x", "--db-password", "--auth-token"])
def test_secret_bearing_flags_are_refused_in_args(flag: str) -> None:
    with pytest.raises(ProfileError) as e:
        load_plan("local", sets=[f'decode.args=["{flag}", "v"]'])
    assert "decode.args[0]: " in str(e.value)
    assert "would put a secret on the command line" in str(e.value)


def _diagnose(tmp_path: Path, *, shareable: bool) -> tuple[Path, dict[str, str]]:
    plan = load_plan("local")
    host = plan.hosts[0]
    run_dir = str(tmp_path / "run")
    spec = plan.processes[0]
    state = DeploymentState(
        plan.deployment, plan.profile_digest, plan, run_dirs={host.name: run_dir}
    )
    log = logs.log_path(run_dir, spec)
    Path(log).parent.mkdir(parents=True)
    Path(log).write_text(
        f"start\nDB_PASS=hunter2 --hf-token hf_abcdefghijklmnopqrstuvwx\nat {run_dir}\n"
    )
    state.processes.append(
        ProcessRecord(spec.name, host.name, spec.stage, 999999, 999999, 5, [], log, 0.0)
    )
    pool = TransportPool(plan.hosts, {host.name: LocalTransport()})
    old = os.umask(0o022)
    try:
        report = gather.gather(pool, state, tmp_path / "out", shareable=shareable)
    finally:
        os.umask(old)
    with tarfile.open(report.archive) as tar:
        members = {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }
    return report.archive, members


def test_the_archive_is_private_and_masks_logs(tmp_path: Path) -> None:
    archive, members = _diagnose(tmp_path, shareable=False)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    assert stat.S_IMODE(archive.parent.stat().st_mode) == 0o700
    assert not any(s in text for text in members.values() for s in SECRETS)


def test_a_shareable_archive_leaves_out_state_environment_and_topology(tmp_path: Path) -> None:
    _, members = _diagnose(tmp_path, shareable=True)
    assert "state.json" not in members
    assert not any(n.startswith("files/") for n in members)
    assert not any(n.endswith(("env.txt", "events.jsonl")) for n in members)
    facts = next(t for n, t in members.items() if n.endswith("facts.txt"))
    assert "===== uname =====" in facts
    assert "===== listening =====" not in facts
    text = "\n".join(members.values())
    assert str(tmp_path / "run") not in text
    assert "<run dir of" in text
    assert not any(s in text for s in SECRETS)
