"""`kvpd restart` of the proxy under load (the service's rolling restart, for real): the kvpd
proxy runs as a deployment process in front of stand-in backends; clients see refused
connections only while it restarts, and no backend keeps requests the old proxy left behind."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from kvpd.exec.local import LocalTransport
from kvpd.exec.service import Deployments
from kvpd.exec.state import StateStore
from kvpd.plan.processes import ADMIN_TOKEN_FILE
from kvpd.plan.value import FileSpec, HealthCheck, HostSpec, Plan, ProcessSpec
from kvpd.testing.backend import StandInBackend
from tests.unit.test_executor import free_port

HOST = "local"


class Backends:
    """A prefiller and a decoder on a loop of their own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.prefill = self._run(StandInBackend("prefill", record=False).start())
        self.decode = self._run(StandInBackend("decode", delay_s=0.2, record=False).start())

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def busy(self) -> int:
        """Requests the backends are still working on."""
        return len(self.prefill._state.tasks) + len(self.decode._state.tasks)

    def close(self) -> None:
        self._run(self.prefill.stop())
        self._run(self.decode.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _plan(run_dir: Path, port: int, b: Backends) -> Plan:
    argv = [sys.executable, "-m", "kvpd.proxy", "--host", "127.0.0.1", "--port", str(port),
            "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(b.prefill.port),
            "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(b.decode.port),
            "--health-interval", "0.2", "--admin-token-file", ADMIN_TOKEN_FILE,
            "--shutdown-grace", "15"]  # fmt: skip
    script = "exec " + " ".join(argv) + "\n"
    return Plan(
        deployment="px",
        profile_digest="sha256:test",
        hosts=(HostSpec(HOST, "127.0.0.1", transport="local", run_dir=str(run_dir)),),
        files=(FileSpec(HOST, "proxy.sh", script),),
        processes=(
            ProcessSpec(
                name="proxy",
                host=HOST,
                role="proxy",
                stage=0,
                script="proxy.sh",
                command=tuple(argv),
                log="logs/proxy.log",
                ports=(port,),
                health=HealthCheck(f"http://127.0.0.1:{port}/health", timeout_s=20, interval_s=0.1),
            ),  # fmt: skip
        ),
        proxy_url=f"http://127.0.0.1:{port}",
    )


def test_proxy_restart_under_load_refuses_only(tmp_path: Path) -> None:
    b = Backends()
    port = free_port()
    outcomes: Counter[str] = Counter()
    stop = threading.Event()

    def load() -> None:
        body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}).encode()
        while not stop.is_set():
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                         {"Content-Type": "application/json"})  # fmt: skip
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()
                    outcomes["ok" if r.status == 200 else f"http {r.status}"] += 1
            except urllib.error.HTTPError as e:
                outcomes[f"http {e.code}"] += 1
            except urllib.error.URLError as e:
                refused = isinstance(e.reason, ConnectionRefusedError)
                outcomes["refused" if refused else f"error {e.reason!r}"] += 1
                time.sleep(0.01)
            except OSError as e:
                outcomes[f"error {e!r}"] += 1

    svc = Deployments(StateStore(tmp_path / "state"), transports={HOST: LocalTransport()})
    threads = [threading.Thread(target=load) for _ in range(4)]
    try:
        svc.up(_plan(tmp_path / "run", port, b), preflight=False)
        for t in threads:
            t.start()
        time.sleep(1.0)
        steps = svc.roll("px", ["proxy"])
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(30)
        print(dict(outcomes))  # pytest -s: how many were refused during the restart
        assert [s.name for s in steps] == ["proxy"]
        bad = {k: v for k, v in outcomes.items() if k not in ("ok", "refused")}
        assert outcomes["ok"] > 20, outcomes
        assert not bad, outcomes
        deadline = time.monotonic() + 5
        while b.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.busy() == 0  # nothing the old proxy sent is still being worked on
        events = [e.what for e in svc.history("px")]
        assert events == ["up", "restart"]
    finally:
        stop.set()
        svc.down("px")
        svc.close()
        b.close()
