#!/usr/bin/env bash
# decode-0 on d1 (decode) for deployment layerwise-sparse-1p1d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/decode-0.log.
cd "$(dirname "$0")/.." || exit 1
source /usr/local/memfabric_hybrid/set_env.sh
set -e
export MEMFABRIC_HYBRID_EXTEND_LIB_PATH=/usr/local/memfabric_hybrid/1.2.0/aarch64-linux/lib64
export KVPD_SPARSE_PLANNER=kvpd
export VLLM_USE_V2_MODEL_RUNNER=0
export PYTHONHASHSEED=0
export HCCL_IF_IP=192.168.20.2
export GLOO_SOCKET_IFNAME=eth0
export TP_SOCKET_IFNAME=eth0
export HCCL_SOCKET_IFNAME=eth0
export VLLM_HOST_IP=192.168.20.2
export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
export PYTHONPATH="$PWD"/bundle/engine${PYTHONPATH:+:"$PYTHONPATH"}

exec vllm serve /models/GLM-5.1-w8a8 \
    --host 192.168.20.2 \
    --port 8200 \
    --data-parallel-size 1 \
    --tensor-parallel-size 16 \
    --max-model-len 32768 \
    --max-num-seqs 16 \
    --trust-remote-code \
    --additional-config '{"sparse_kv_offload_config": {"enabled": true, "topk_buffer_size": 4096, "dram_size_per_dp_GB": 128}}' \
    --kv-transfer-config '{"kv_connector": "SfaRemoteD2HConnector", "kv_role": "kv_consumer", "kv_port": 20050, "kv_connector_extra_config": {"transfer_backend": "memfabric", "use_layerwise": true}}'
