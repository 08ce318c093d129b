#!/usr/bin/env bash
# prefill-0 on p1 (prefill) for deployment ucm-mooncake-2p2d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/prefill-0.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export MOONCAKE_CONFIG_PATH=conf/mooncake.json
export PYTHONHASHSEED=0
export LD_LIBRARY_PATH=/usr/local/lib:/usr/local/Ascend/ascend-toolkit/latest/python/site-packages:"${LD_LIBRARY_PATH}"
export PYTHONPATH="${PYTHONPATH}":/vllm-workspace/vllm
export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3

exec vllm serve /models/QwQ-32B \
    --host 0.0.0.0 \
    --port 9000 \
    --data-parallel-size 1 \
    --tensor-parallel-size 4 \
    --seed 1024 \
    --max-model-len 17000 \
    --max-num-batched-tokens 8000 \
    --max-num-seqs 20 \
    --trust-remote-code \
    --gpu-memory-utilization 0.92 \
    --enforce-eager \
    --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": 20001, "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 4}, "decode": {"dp_size": 1, "tp_size": 4}}}, {"kv_connector": "UCMConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"UCM_CONFIG_FILE": "conf/ucm.yaml"}}]}}'
