#!/usr/bin/env bash
# prefill-dp0 on p1 (prefill) for deployment large-ep.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/prefiller_dp_0.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export MOONCAKE_CONFIG_PATH=conf/mooncake.json
export PYTHONHASHSEED=0
export LD_LIBRARY_PATH=/usr/local/lib:/usr/local/Ascend/ascend-toolkit/latest/python/site-packages:"${LD_LIBRARY_PATH}"
export PYTHONPATH="${PYTHONPATH}":/vllm-workspace/vllm
export OMP_PROC_BIND=false
export OMP_NUM_THREADS=10
export HCCL_BUFFSIZE=256
export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
export TASK_QUEUE_ENABLE=1
export VLLM_USE_MODELSCOPE=True
export HCCL_IF_IP=192.168.10.1
export GLOO_SOCKET_IFNAME=eth0
export TP_SOCKET_IFNAME=eth0
export HCCL_SOCKET_IFNAME=eth0
export VLLM_HOST_IP=192.168.10.1
export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7

exec vllm serve /models/GLM-5.1-w4a8 \
    --host 0.0.0.0 \
    --port 9000 \
    --data-parallel-size 4 \
    --data-parallel-address 192.168.10.1 \
    --data-parallel-rpc-port 13395 \
    --data-parallel-rank 0 \
    --tensor-parallel-size 8 \
    --enable-expert-parallel \
    --seed 1024 \
    --max-model-len 17000 \
    --max-num-batched-tokens 8000 \
    --max-num-seqs 4 \
    --trust-remote-code \
    --gpu-memory-utilization 0.92 \
    --quantization ascend \
    --enforce-eager \
    --additional-config '{"enable_weight_nz_layout": true, "enable_prefill_optimizations": true}' \
    --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": 20001, "kv_connector_extra_config": {"prefill": {"dp_size": 4, "tp_size": 8}, "decode": {"dp_size": 8, "tp_size": 4}}}, {"kv_connector": "UCMConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"UCM_CONFIG_FILE": "conf/ucm.yaml"}}]}}'
