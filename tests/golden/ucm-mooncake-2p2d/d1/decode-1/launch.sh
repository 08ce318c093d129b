#!/usr/bin/env bash
# decode-1 on d1 (decode) for deployment ucm-mooncake-2p2d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/decode-1.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export MOONCAKE_CONFIG_PATH=conf/mooncake.json
export PYTHONHASHSEED=0
export LD_LIBRARY_PATH=/usr/local/lib:/usr/local/Ascend/ascend-toolkit/latest/python/site-packages:"${LD_LIBRARY_PATH}"
export PYTHONPATH="${PYTHONPATH}":/vllm-workspace/vllm
export ASCEND_RT_VISIBLE_DEVICES=4,5,6,7

exec vllm serve /models/QwQ-32B \
    --host 0.0.0.0 \
    --port 9001 \
    --data-parallel-size 1 \
    --tensor-parallel-size 4 \
    --seed 1024 \
    --max-model-len 17000 \
    --max-num-batched-tokens 8000 \
    --max-num-seqs 4 \
    --trust-remote-code \
    --gpu-memory-utilization 0.92 \
    --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
    --kv-transfer-config '{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "kv_port": 20005, "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 4}, "decode": {"dp_size": 1, "tp_size": 4}}}'
