"""Build and run the real `vllm bench serve` command line for one phase of a protocol."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpd.bench.records import PhaseName
from kvpd.errors import BenchError

ENV_VLLM = "KVPD_VLLM"
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,90,99"


class ClientNotInstalled(BenchError):
    """No `vllm` command with `bench serve` was found."""

    exit_code = 2


def find_vllm() -> str:
    """$KVPD_VLLM, else `vllm` on PATH, else $KVPD_ENGINE_VENV/bin/vllm (default: the checkout's
    .venv-engine)."""
    explicit = os.environ.get(ENV_VLLM)
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise ClientNotInstalled(
            f"${ENV_VLLM} is {explicit!r}, which is not an executable file. Point it at the "
            "engine venv's `vllm` (e.g. .venv-engine/bin/vllm) or unset it."
        )
    on_path = shutil.which("vllm")
    if on_path:
        return on_path
    from kvpd.engine.venv import engine_venv

    candidate = engine_venv() / "bin" / "vllm"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    raise ClientNotInstalled(
        f"the benchmark client `vllm bench serve` is not installed: no `vllm` on PATH, no "
        f"${ENV_VLLM}, and no {candidate}. Install the CPU engine with `make engine` (or set "
        f"{ENV_VLLM} to a `vllm` command)."
    )


@dataclass(frozen=True)
class Phase:
    """One `vllm bench serve` invocation of a protocol."""

    name: PhaseName
    input_len: int
    output_len: int
    num_prompts: int
    seed: int
    request_rate: float | str
    max_concurrency: int | None
    ignore_eos: bool
    measured: bool = True  # False: only prepares the caches (its numbers are not a result)


def seed_input_len(input_len: int, prefix_ratio: float) -> int:
    """The seeding phase's input length: target x ratio, rounded down (25600 for 32000 x 0.8),
    at least 1 token."""
    return max(1, int(input_len * prefix_ratio + 1e-9))


def protocol_phases(
    protocol: str,
    *,
    input_len: int,
    output_len: int,
    num_prompts: int,
    seed: int,
    request_rate: float | str,
    max_concurrency: int | None,
    ignore_eos: bool,
    prefix_ratio: float,
) -> list[Phase]:
    """The phases of a protocol, in order (the values come from bench Settings, whose defaults
    are the schema's).

    - plain: one measured run.
    - prefix (the guides' KV-cache seeding): first the same prompts cut to input x ratio with
      output 1, then the measured run. Same seed and count, so each measured prompt starts
      with its seeded prompt (the random dataset draws the same offsets for the same seed).
    - twice (the PD-mixed section): the same run twice, cold then warm; both are reported.
    """

    def phase(name: PhaseName, inp: int, out: int, measured: bool = True) -> Phase:
        return Phase(name, inp, out, num_prompts, seed, request_rate, max_concurrency,
                     ignore_eos, measured)  # fmt: skip

    if protocol == "plain":
        return [phase("run", input_len, output_len)]
    if protocol == "prefix":
        seeded = seed_input_len(input_len, prefix_ratio)
        return [
            phase("seed", seeded, 1, measured=False),
            phase("measured", input_len, output_len),
        ]
    if protocol == "twice":
        return [
            phase("cold", input_len, output_len),
            phase("warm", input_len, output_len),
        ]
    raise BenchError(f"unknown bench protocol {protocol!r}: use plain, prefix or twice.")


def rate_arg(rate: float | str) -> str:
    if isinstance(rate, str):
        return rate
    return "inf" if rate == float("inf") else f"{rate:g}"


def build_argv(
    vllm: str,
    phase: Phase,
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    result_dir: str,
    result_filename: str,
    metadata: dict[str, str] | None = None,
    endpoint: str = "/v1/completions",
    extra: list[str] | None = None,
) -> list[str]:
    argv = [
        vllm, "bench", "serve",
        "--backend", "vllm",
        "--base-url", base_url.rstrip("/"),
        "--endpoint", endpoint,
        "--model", model,
        "--dataset-name", "random",
        "--random-input-len", str(phase.input_len),
        "--random-output-len", str(phase.output_len),
        # fixed lengths: the prefix protocol relies on identical draws in both phases
        "--random-range-ratio", "0",
        "--num-prompts", str(phase.num_prompts),
        "--seed", str(phase.seed),
        "--request-rate", rate_arg(phase.request_rate),
        "--percentile-metrics", PERCENTILE_METRICS,
        "--metric-percentiles", METRIC_PERCENTILES,
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",  # per-request TTFTs for the distribution chart
        "--result-dir", result_dir,
        "--result-filename", result_filename,
    ]  # fmt: skip
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    if phase.max_concurrency is not None:
        argv += ["--max-concurrency", str(phase.max_concurrency)]
    if phase.ignore_eos:
        argv.append("--ignore-eos")
    meta = {"kvpd_phase": phase.name, **(metadata or {})}
    argv.append("--metadata")
    argv += [f"{k}={v}" for k, v in meta.items()]
    if extra:
        argv += extra
    return argv


def client_env(tokenizer: str, base_url: str, scratch: Path | None = None) -> dict[str, str]:
    """The client's environment: offline when the tokenizer is a local folder, no telemetry,
    the target host exempt from any HTTP proxy, and torch's caches in `scratch` (importing torch
    otherwise leaves /tmp/torchinductor_<user> behind)."""
    env = dict(os.environ)
    if scratch is not None:
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(scratch / "torchinductor"))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    if tokenizer and Path(tokenizer).is_dir():
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
    host = base_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(p for p in (env.get(key, ""), host, "127.0.0.1", "localhost") if p)
    return env


@dataclass
class RunOutput:
    argv: list[str]
    returncode: int
    stdout: str
    log: str  # where stdout+stderr were written
    seconds: float
    timed_out: bool = False
    tail: list[str] = field(default_factory=list)


def run(argv: list[str], *, env: dict[str, str], log: Path, timeout_s: float = 3600.0) -> RunOutput:
    """Run the client in its own process group (a timeout or Ctrl-C stops all of it); stdout
    and stderr go to `log`, stdout is also returned for parsing."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "w") as err_f:
        err_f.write("$ " + " ".join(argv) + "\n")
        err_f.flush()
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=err_f,
            env=env,
            text=True,
            start_new_session=True,
        )
        timed_out = False
        try:
            stdout, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            stdout, _ = proc.communicate()
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        err_f.write(stdout)
    text = log.read_text(errors="replace")
    return RunOutput(
        argv,
        proc.returncode,
        stdout,
        str(log),
        time.monotonic() - started,
        timed_out,
        text.splitlines()[-20:],
    )


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """TERM, then KILL the client's group, only while its leader is unreaped: once reaped, its
    number may belong to another process group."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.returncode is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
