#!/usr/bin/env bash
# decode-1 on d1 (decode) for deployment ucm-centralized-2p2d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/decode-1.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export PYTHONHASHSEED=123456
export ASCEND_RT_VISIBLE_DEVICES=4,5,6,7

exec vllm serve /models/QwQ-32B \
    --host 0.0.0.0 \
    --port 7803 \
    --data-parallel-size 1 \
    --tensor-parallel-size 4 \
    --seed 1024 \
    --max-model-len 17000 \
    --max-num-batched-tokens 8000 \
    --max-num-seqs 20 \
    --trust-remote-code \
    --gpu-memory-utilization 0.92 \
    --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
    --kv-transfer-config '{"kv_connector": "UCMConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"UCM_CONFIG_FILE": "conf/ucm.yaml"}}'
