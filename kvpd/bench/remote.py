"""`vllm bench serve` on a cluster host (`bench.host`), as the guides run it.

The client runs over SSH on that host with the model's path as tokenizer (which only the
cluster has); its result file is copied back into the local results folder, so the reports,
proof and charts are the same as for a client on this machine. Everything it writes on the
host stays in that host's run dir (`bench/<run>/<scenario>`)."""

from __future__ import annotations

import posixpath
import time
from pathlib import Path
from typing import Protocol

from kvpd.bench.runner import RunOutput
from kvpd.exec.transport import CommandResult
from kvpd.plan.value import Plan
from kvpd.profile.roles import Role

# What the client needs in its environment on the host (the rest of this machine's is not sent).
# OPENAI_API_KEY: the proxy's client key, when the profile sets proxy.client_key_file.
CLIENT_ENV = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "NO_PROXY", "no_proxy", "HF_TOKEN",
              "OPENAI_API_KEY")  # fmt: skip


class HostService(Protocol):
    def host_dir(self, plan: Plan, host: str, *parts: str) -> str: ...
    def run_on(
        self, plan: Plan, host: str, argv: list[str], *, env: dict[str, str], timeout_s: float
    ) -> CommandResult: ...
    def read_on(self, plan: Plan, host: str, path: str) -> bytes: ...


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


class RemoteClient:
    """A `run_client` for the bench session that runs the client on `host`."""

    def __init__(self, service: HostService, plan: Plan, host: str, run_name: str, vllm: str):
        self.service, self.plan, self.host = service, plan, host
        self.run_name = run_name  # the local results folder's name, reused on the host
        self.vllm = vllm

    def __call__(
        self, argv: list[str], *, env: dict[str, str], log: Path, timeout_s: float = 3600.0
    ) -> RunOutput:
        local_dir = _flag(argv, "--result-dir") or str(log.parent)
        filename = _flag(argv, "--result-filename") or "result.json"
        remote_dir = self.service.host_dir(
            self.plan, self.host, "bench", self.run_name, Path(local_dir).name
        )
        client = [self.vllm, *argv[1:]]
        client[client.index("--result-dir") + 1] = remote_dir
        # coreutils `timeout` stops the client on the host too (closing the SSH channel at the
        # deadline would leave it running there)
        remote = ["timeout", "-k", "10", f"{max(1, int(timeout_s))}", *client]
        renv = {k: env[k] for k in CLIENT_ENV if env.get(k)}
        renv["TORCHINDUCTOR_CACHE_DIR"] = posixpath.join(remote_dir, ".cache", "torchinductor")
        if self.plan.tokenizer.startswith("/"):  # a model folder: no hub lookups
            renv["HF_HUB_OFFLINE"] = renv["TRANSFORMERS_OFFLINE"] = "1"
        started = time.monotonic()
        r = self.service.run_on(self.plan, self.host, remote, env=renv, timeout_s=timeout_s + 30)
        seconds = time.monotonic() - started
        log.parent.mkdir(parents=True, exist_ok=True)
        text = f"$ ({self.host}) {' '.join(remote)}\n{r.stderr}{r.stdout}"
        log.write_text(text)
        try:
            data = self.service.read_on(self.plan, self.host, posixpath.join(remote_dir, filename))
            (Path(local_dir) / filename).write_bytes(data)
        except (FileNotFoundError, OSError):
            pass  # the session reports the exit code and the log's tail
        timed_out = r.exit_code in (124, 137) or "timed out after" in r.stderr
        return RunOutput(
            remote, r.exit_code, r.stdout, str(log), seconds, timed_out, text.splitlines()[-20:]
        )


def default_host(plan: Plan, local_ok: bool) -> str | None:
    """Where the client runs when the profile does not say: this machine when it has `vllm`
    and the tokenizer and a route to the proxy (`local_ok`), else the proxy's host (the guides
    run it on a cluster node; behind a bastion only SSH reaches the cluster, and a client
    through a tunnel would measure the tunnel), else the first mixed engine's. None: this
    machine."""
    if local_ok:
        return None
    for role in (Role.PROXY, Role.MIXED, Role.DECODE):
        p = next((x for x in plan.processes if x.role == role), None)
        if p is not None:
            return p.host
    return None


def where(plan: Plan, host: str | None) -> str:
    """Where the client ran, for the report."""
    if host is None:
        return "this machine"
    if plan.bench.host is not None:
        return f"{host} (bench.host)"
    return f"{host}, the proxy's host (bench.host unset)"
