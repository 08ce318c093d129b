"""The bundled profiles reproduce the guides' commands flag for flag.

The guide commands below are copied from the two deployment guides (shared/seeds). Each is
parsed into {flag: value} (JSON values parsed) and compared with kvpd's rendered command. The
only differences allowed are listed per test (paths kvpd chooses, and the kv_port fix).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from kvpd.plan.build import load_plan

UCM_FILE = "UCM_CONFIG_FILE"


def flags(argv: list[str] | tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                v: Any = argv[i + 1]
                if v.lstrip().startswith("{"):
                    v = json.loads(v)
                out[a] = v
                i += 2
                continue
            out[a] = True
        elif "model" not in out:
            out["model"] = a if a not in ("vllm", "serve") else out.get("model")
            if a in ("vllm", "serve"):
                out.pop("model")
        i += 1
    return out


def guide(cmd: str) -> dict[str, Any]:
    return flags(shlex.split(cmd.replace("\\\n", " ")))


def ours(profile: str, proc: str) -> dict[str, Any]:
    return flags(load_plan(profile).process(proc).command)


def _strip_ucm_path(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: ("<ucm.yaml>" if k == UCM_FILE else _strip_ucm_path(v)) for k, v in d.items()}
    if isinstance(d, list):
        return [_strip_ucm_path(x) for x in d]
    return d


UCM_P = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 7800 --gpu-memory-utilization 0.92 \
 --data-parallel-size 1 --tensor-parallel-size 4 --seed 1024 --max-model-len 17000 \
 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code --enforce-eager \
 --kv-transfer-config '{"kv_connector": "UCMConnector", "kv_role": "kv_both",
 "kv_connector_extra_config": {"UCM_CONFIG_FILE": "/path/to/ucm_config_example.yaml"}}'"""

UCM_D = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 7802 --gpu-memory-utilization 0.92 \
 --data-parallel-size 1 --tensor-parallel-size 4 --seed 1024 --max-model-len 17000 \
 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code \
 --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' \
 --kv-transfer-config '{"kv_connector": "UCMConnector", "kv_role": "kv_both",
 "kv_connector_extra_config": {"UCM_CONFIG_FILE": "/path/to/ucm_config_example.yaml"}}'"""


def test_ucm_centralized() -> None:
    for proc, cmd in (("prefill-0", UCM_P), ("decode-0", UCM_D)):
        assert _strip_ucm_path(ours("ucm-centralized-2p2d", proc)) == _strip_ucm_path(guide(cmd))
    second = ours("ucm-centralized-2p2d", "decode-1")
    assert second["--port"] == "7803"
    p = load_plan("ucm-centralized-2p2d")
    assert dict(p.process("prefill-1").env)["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert dict(p.process("prefill-0").env)["PYTHONHASHSEED"] == "123456"


P2P_P = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 9000 --gpu-memory-utilization 0.92 \
 --data-parallel-size 1 --tensor-parallel-size 4 --seed 1024 --max-model-len 17000 \
 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code --enforce-eager \
 --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_producer",
  "kv_connector_extra_config": {"connectors": [
   {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": 20001,
    "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 4},
                                  "decode": {"dp_size": 1, "tp_size": 4}}},
   {"kv_connector": "UCMConnector", "kv_role": "kv_both", "kv_connector_extra_config":
    {"UCM_CONFIG_FILE":
     "/vllm-workspace/unified-cache-management/examples/ucm_config_example.yaml"}}]}}'"""

P2P_D = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 9000 --data-parallel-size 1 \
 --tensor-parallel-size 4 --seed 1024 --max-model-len 17000 --max-num-batched-tokens 8000 \
 --trust-remote-code --max-num-seqs 4 --gpu-memory-utilization 0.92 \
 --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' \
 --kv-transfer-config '{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer",
  "kv_port": 20001, "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 4},
  "decode": {"dp_size": 1, "tp_size": 4}}}'"""


def test_ucm_mooncake_p2p() -> None:
    # the one deliberate difference: the UCM yaml is kvpd's own copy in the run directory,
    # not UCM's shipped example edited in place
    ucm = _strip_ucm_path(ours("ucm-mooncake-2p2d", "prefill-0"))
    assert ucm == _strip_ucm_path(guide(P2P_P))
    assert "conf/ucm.yaml" in str(ours("ucm-mooncake-2p2d", "prefill-0"))
    assert ours("ucm-mooncake-2p2d", "decode-0") == guide(P2P_D)
    p = load_plan("ucm-mooncake-2p2d")
    env = dict(p.process("prefill-0").env)
    assert env["MOONCAKE_CONFIG_PATH"] == "conf/mooncake.json"
    assert env["PYTHONHASHSEED"] == "0"
    master = p.process("mooncake-master").command
    assert " ".join(master) == (
        "mooncake_master --port 50088 --eviction_high_watermark_ratio 0.9 --eviction_ratio 0.1 "
        "--default_kv_lease_ttl 11000"
    )


MIXED = """vllm serve /models/QwQ-32B --host 0.0.0.0 --port 7800 --gpu-memory-utilization 0.92 \
 --data-parallel-size 2 --tensor-parallel-size 4 --seed 1024 --max-model-len 17000 \
 --max-num-batched-tokens 8000 --max-num-seqs 20 --trust-remote-code --enforce-eager \
 --block-size 128 --kv-transfer-config '{"kv_connector": "UCMConnector", "kv_role": "kv_both",
 "kv_connector_extra_config": {"UCM_CONFIG_FILE": "/path/to/ucm_config_example.yaml"}}'"""


def test_pd_mixed() -> None:
    assert _strip_ucm_path(ours("ucm-pd-mixed", "mixed-0")) == _strip_ucm_path(guide(MIXED))
    env = dict(load_plan("ucm-pd-mixed").process("mixed-0").env)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


EP_D = """vllm serve /models/GLM-5.1-w4a8 --host 0.0.0.0 --port 9001 --data-parallel-size 8 \
 --data-parallel-address 192.168.10.5 --data-parallel-rpc-port 13395 --data-parallel-rank 3 \
 --tensor-parallel-size 4 --enable-expert-parallel --seed 1024 --max-model-len 17000 \
 --max-num-batched-tokens 8000 --trust-remote-code --max-num-seqs 4 \
 --gpu-memory-utilization 0.92 --quantization ascend \
 --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' \
 --kv-transfer-config '{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer",
  "kv_port": 20005, "kv_connector_extra_config": {"prefill": {"dp_size": 4, "tp_size": 8},
  "decode": {"dp_size": 8, "tp_size": 4}}}'"""

EP_P = """vllm serve /models/GLM-5.1-w4a8 --host 0.0.0.0 --port 9000 --data-parallel-size 4 \
 --data-parallel-address 192.168.10.1 --data-parallel-rpc-port 13395 --data-parallel-rank 2 \
 --tensor-parallel-size 8 --enable-expert-parallel --seed 1024 --max-model-len 17000 \
 --max-num-batched-tokens 8000 --trust-remote-code --max-num-seqs 4 \
 --gpu-memory-utilization 0.92 --quantization ascend --enforce-eager \
 --additional-config '{"enable_weight_nz_layout":true,"enable_prefill_optimizations":true}' \
 --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_producer",
  "kv_connector_extra_config": {"connectors": [
   {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": 20001,
    "kv_connector_extra_config": {"prefill": {"dp_size": 4, "tp_size": 8},
                                  "decode": {"dp_size": 8, "tp_size": 4}}},
   {"kv_connector": "UCMConnector", "kv_role": "kv_both",
    "kv_connector_extra_config": {"UCM_CONFIG_FILE": "/path/to/ucm_config_example.yaml"}}]}}'"""


def test_large_ep_per_rank_commands() -> None:
    # decode node 192.168.10.6 (d2), second local DP process: dp_rank 3, port 9001,
    # mooncake_port = 20001 + 1 * tp, NPUs 4-7 (run_multi_dp.sh arithmetic)
    assert ours("large-ep", "decode-dp3") == guide(EP_D)
    assert _strip_ucm_path(ours("large-ep", "prefill-dp2")) == _strip_ucm_path(guide(EP_P))
    p = load_plan("large-ep")
    env = dict(p.process("decode-dp3").env)
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5,6,7"
    assert env["HCCL_IF_IP"] == "192.168.10.6"
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == env["HCCL_SOCKET_IFNAME"]
    for k, v in {
        "OMP_PROC_BIND": "false",
        "OMP_NUM_THREADS": "10",
        "HCCL_BUFFSIZE": "256",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "1",
        "VLLM_USE_MODELSCOPE": "True",
    }.items():
        assert env[k] == v
    proxy = flags(p.process("proxy").command)
    assert proxy["--decoder-ports"] == "9000"  # first of the list; the full list below
    argv = list(p.process("proxy").command)
    dec_hosts = argv[argv.index("--decoder-hosts") + 1 : argv.index("--decoder-ports")]
    assert dec_hosts == [f"192.168.10.{5 + i // 2}" for i in range(8)]


LW_P_KV = {
    "kv_connector": "MultiConnector",
    "kv_role": "kv_producer",
    "kv_connector_extra_config": {
        "connectors": [
            {
                "kv_connector": "SfaRemoteD2HConnector",
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"transfer_backend": "memfabric"},
            },
            {
                "kv_connector": "AscendStoreConnector",
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {
                    "backend": "memcache",
                    "use_layerwise": True,
                    "layerwise_num_shared_buffers": 3,
                    "layerwise_independent_layers": [0],
                },
            },
        ]
    },
}
LW_D_KV = {
    "kv_connector": "SfaRemoteD2HConnector",
    "kv_role": "kv_consumer",
    "kv_port": 20050,
    "kv_connector_extra_config": {"transfer_backend": "memfabric", "use_layerwise": True},
}
LW_D_ADD = {
    "sparse_kv_offload_config": {
        "enabled": True,
        "topk_buffer_size": 4096,
        "dram_size_per_dp_GB": 128,
    }
}


def test_layerwise_and_sparse() -> None:
    p = ours("layerwise-sparse-1p1d", "prefill-0")
    d = ours("layerwise-sparse-1p1d", "decode-0")
    assert p["--kv-transfer-config"] == LW_P_KV
    assert p["--enforce-eager"] is True
    assert "--additional-config" not in p  # never sparse_kv_offload_config on prefill
    assert d["--kv-transfer-config"] == LW_D_KV
    assert d["--additional-config"] == LW_D_ADD
    plan = load_plan("layerwise-sparse-1p1d")
    penv = dict(plan.process("prefill-0").env)
    assert penv["MMC_LOCAL_CONFIG_PATH"] == "conf/mmc-local.conf"
    assert penv["MEMFABRIC_HYBRID_EXTEND_LIB_PATH"].endswith("1.2.0/aarch64-linux/lib64")
    assert penv["PYTHONHASHSEED"] == "0"
    meta = plan.process("metaservice")
    assert meta.command[-1] == "from memcache_hybrid import MetaService; MetaService.main()"
    assert dict(meta.env)["MMC_META_CONFIG_PATH"] == "conf/mmc-meta.conf"
    proxy = flags(plan.process("proxy").command)
    assert proxy["--flow"] == "layerwise"
    assert proxy["--host"] == "192.168.20.1"
