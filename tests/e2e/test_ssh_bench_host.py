"""`bench.host` over real SSH: the client runs on a bed host, writes only in that host's run
dir, gets only the client's environment, and its result file comes back to this machine."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from kvpd.bench import runner
from kvpd.bench.remote import RemoteClient
from kvpd.exec.service import Deployments
from kvpd.exec.ssh.transport import SSHTransport
from kvpd.exec.state import StateStore
from kvpd.plan.value import Plan

pytestmark = [pytest.mark.e2e, pytest.mark.ssh]

# A stand-in for `vllm bench serve` (the bed hosts run no vLLM client here): it writes the
# result file where --result-dir/--result-filename say, with what it saw.
STAND_IN = """#!{python}
import json, os, socket, sys
a = sys.argv[1:]
d, f = a[a.index("--result-dir") + 1], a[a.index("--result-filename") + 1]
json.dump({{"completed": 2, "failed": 0, "host": socket.gethostname(), "cwd_dir": d,
            "env": dict(os.environ)}}, open(os.path.join(d, f), "w"))
print("Successful requests:                     2")
"""


def test_client_on_a_bed_host_and_results_back(testbed, tmp_path: Path) -> None:
    run_dir = f"/tmp/kvpd-bench-host-{uuid.uuid4().hex[:8]}"
    spec = testbed.spec("h2", run_dir=run_dir)
    t = SSHTransport(spec)
    try:
        client = f"{run_dir}/stand-in-vllm"
        t.put(client, STAND_IN.format(python=sys.executable).encode(), mode=0o755)
        plan = Plan("bh", "d", (spec,), (), (), tokenizer="/models/QwQ-32B")
        service = Deployments(StateStore(tmp_path / "state"), transports={"h2": t})
        local = tmp_path / "results" / "raw" / "ucm"
        local.mkdir(parents=True)
        phase = runner.Phase("measured", 128, 8, 2, 1, "inf", None, True)
        argv = runner.build_argv("/not/here/vllm", phase, base_url="http://10.0.0.1:7850",
                                 model="m", tokenizer="/models/QwQ-32B",
                                 result_dir=str(local), result_filename="x.json")  # fmt: skip
        env = runner.client_env("/models/QwQ-32B", "http://10.0.0.1:7850")
        out = RemoteClient(service, plan, "h2", "run1", client)(
            argv, env=env, log=local / "x.log", timeout_s=120
        )
        assert out.returncode == 0, out.tail
        got = json.loads((local / "x.json").read_text())
        assert got["host"] != __import__("socket").gethostname()  # it ran on the bed host
        assert got["cwd_dir"] == f"{run_dir}/bench/run1/ucm"
        assert got["env"]["HF_HUB_OFFLINE"] == "1"
        assert t.run(["test", "-f", f"{run_dir}/bench/run1/ucm/x.json"]).ok
    finally:
        t.run(["rm", "-rf", "--", run_dir])
        t.close()
