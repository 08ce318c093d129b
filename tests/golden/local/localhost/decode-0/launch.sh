#!/usr/bin/env bash
# decode-0 on localhost (decode) for deployment local.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/decode-0.log.
cd "$(dirname "$0")/.." || exit 1
mkdir -p cache rpc tmp || exit 1
set -e
export PYTHONHASHSEED=0
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1
export VLLM_HOST_IP=127.0.0.1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
export VLLM_CACHE_ROOT="${HOME}"/.cache/kvpd/vllm
export TORCHINDUCTOR_CACHE_DIR="${HOME}"/.cache/kvpd/inductor
export XDG_CACHE_HOME=cache/xdg
export VLLM_RPC_BASE_PATH=rpc
export TMPDIR=tmp
export VLLM_CPU_OMP_THREADS_BIND=1
export PYTHONPATH="$PWD"/bundle/engine${PYTHONPATH:+:"$PYTHONPATH"}

exec vllm serve /srv/kvpd/.kvpd/models/tiny \
    --host 127.0.0.1 \
    --port 18200 \
    --data-parallel-size 1 \
    --tensor-parallel-size 1 \
    --max-model-len 512 \
    --max-num-batched-tokens 4096 \
    --max-num-seqs 16 \
    --kv-cache-memory-bytes 16M \
    --served-model-name tiny \
    --enforce-eager \
    --block-size 32 \
    --no-enable-chunked-prefill \
    --kv-transfer-config '{"kv_connector": "KvpdStoreConnector", "kv_connector_module_path": "kvpd.connectors.store", "kv_role": "kv_consumer", "kv_connector_extra_config": {"store_path": "/srv/kvpd/.kvpd/local/run/kv", "dram_cache_gb": 0.25, "capacity_gb": 1.0, "io_threads": 2}}' \
    --enable-prompt-tokens-details
