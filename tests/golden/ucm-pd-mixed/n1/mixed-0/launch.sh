#!/usr/bin/env bash
# mixed-0 on n1 (mixed) for deployment ucm-pd-mixed.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/mixed-0.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
export PYTHONHASHSEED=0

exec vllm serve /models/QwQ-32B \
    --host 0.0.0.0 \
    --port 7800 \
    --data-parallel-size 2 \
    --tensor-parallel-size 4 \
    --seed 1024 \
    --max-model-len 17000 \
    --max-num-batched-tokens 8000 \
    --max-num-seqs 20 \
    --trust-remote-code \
    --gpu-memory-utilization 0.92 \
    --enforce-eager \
    --block-size 128 \
    --kv-transfer-config '{"kv_connector": "UCMConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"UCM_CONFIG_FILE": "conf/ucm.yaml"}}'
