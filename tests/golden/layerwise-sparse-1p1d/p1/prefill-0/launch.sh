#!/usr/bin/env bash
# prefill-0 on p1 (prefill) for deployment layerwise-sparse-1p1d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/prefill-0.log.
cd "$(dirname "$0")/.." || exit 1
source /usr/local/memcache_hybrid/set_env.sh
source /usr/local/memfabric_hybrid/set_env.sh
set -e
export MMC_LOCAL_CONFIG_PATH=conf/mmc-local.conf
export MEMFABRIC_HYBRID_EXTEND_LIB_PATH=/usr/local/memfabric_hybrid/1.2.0/aarch64-linux/lib64
export PYTHONHASHSEED=0
export HCCL_IF_IP=192.168.20.1
export GLOO_SOCKET_IFNAME=eth0
export TP_SOCKET_IFNAME=eth0
export HCCL_SOCKET_IFNAME=eth0
export VLLM_HOST_IP=192.168.20.1
export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15

exec vllm serve /models/GLM-5.1-w8a8 \
    --host 192.168.20.1 \
    --port 8100 \
    --data-parallel-size 1 \
    --tensor-parallel-size 16 \
    --max-model-len 32768 \
    --max-num-seqs 16 \
    --trust-remote-code \
    --enforce-eager \
    --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "SfaRemoteD2HConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"transfer_backend": "memfabric"}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"backend": "memcache", "use_layerwise": true, "layerwise_num_shared_buffers": 3, "layerwise_independent_layers": [0]}}]}}'
