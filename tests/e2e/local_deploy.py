"""A real local deployment (CPU vLLM prefill + decode + kvpd proxy) for end-to-end tests.

Started once per test session through the real CLI (`kvpd up`), under its own deployment name
and ports so it never collides with a developer's own `local` deployment, and stopped with
`kvpd down` at the end. Skips with the reason when the CPU engine or the tiny model is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE = Path(os.environ.get("KVPD_ENGINE_VENV", REPO / ".venv-engine"))
MODEL = REPO / ".kvpd" / "models" / "tiny"


def kvpd_env() -> dict[str, str]:
    env = dict(os.environ)
    bins = [str(ENGINE / "bin"), str(Path(sys.executable).parent)]
    env["PATH"] = os.pathsep.join(bins + [env.get("PATH", "")])
    env["KVPD_ENGINE_VENV"] = str(ENGINE)
    return env


def kvpd(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvpd.cli.main", *args]
    r = subprocess.run(
        cmd, cwd=REPO, env=kvpd_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and r.returncode != 0:
        out = f"{r.stdout}\n{r.stderr}"
        raise AssertionError(f"kvpd {' '.join(args)} exited {r.returncode}:\n{out}")
    return r


def engine_missing() -> str | None:
    if not (ENGINE / "bin" / "vllm").exists():
        return f"CPU engine not installed at {ENGINE} (run `make engine`)"
    if not (MODEL / "config.json").exists():
        return f"tiny model missing at {MODEL} (run `make model`)"
    return None


@dataclass
class LocalDeployment:
    name: str
    sets: list[str]
    proxy: str
    prefill: str
    decode: str
    state_file: Path
    args: list[str] = field(default_factory=list)

    def state(self) -> dict:
        return json.loads(self.state_file.read_text())

    def ensure_up(self) -> LocalDeployment:
        """Start it again if a test broke it (one kills its decode on purpose), so every test
        gets a healthy deployment whatever ran before it."""
        r = kvpd("status", "--deployment", self.name, "--json", check=False)
        procs = json.loads(r.stdout).get("processes", []) if r.returncode == 0 else []
        if procs and all(p["alive"] and p["healthy"] is not False for p in procs):
            return self
        kvpd("down", "--deployment", self.name, check=False)
        kvpd("up", "local", "--yes", *self.args)
        return self


def set_args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def local_sets(name: str, base_port: int) -> list[str]:
    return [
        f"name={name}",
        f"proxy.port={base_port}",
        f"prefill.port={base_port + 100}",
        f"decode.port={base_port + 200}",
        f"kv.example_path=.kvpd/{name}/run/kv",
        f"kv.kvpd_store.path=.kvpd/{name}/run/kv",
        f"runtime.run_dir=.kvpd/{name}/run",
    ]


def get_json(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"raw": raw.decode(errors="replace")}


def complete(url: str, prompt: str, n: int = 12, **extra: Any) -> tuple[int, dict]:
    """A greedy completion of `n` tokens of the tiny model at `url`: (HTTP status, body)."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    return get_json(url + "/v1/completions", body)


def metric(url: str, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


@pytest.fixture
def local_deployment(_local_deployment: LocalDeployment) -> LocalDeployment:
    """The shared local deployment, healthy."""
    return _local_deployment.ensure_up()


@pytest.fixture(scope="session")
def _local_deployment():
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    name, port = "e2e-local", 18600
    sets = local_sets(name, port)
    kvpd("down", "--deployment", name, check=False)
    shutil.rmtree(REPO / ".kvpd" / name, ignore_errors=True)
    kvpd("up", "local", "--yes", *set_args(sets))
    dep = LocalDeployment(
        name=name,
        sets=sets,
        proxy=f"http://127.0.0.1:{port}",
        prefill=f"http://127.0.0.1:{port + 100}",
        decode=f"http://127.0.0.1:{port + 200}",
        state_file=REPO / ".kvpd" / name / "state.json",
        args=set_args(sets),
    )
    try:
        yield dep
    finally:
        kvpd("down", "--deployment", name, check=False)
