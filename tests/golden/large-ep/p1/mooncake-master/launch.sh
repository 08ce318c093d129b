#!/usr/bin/env bash
# mooncake-master on p1 (mooncake) for deployment large-ep.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/mooncake-master.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export LD_LIBRARY_PATH=/usr/local/lib:"${LD_LIBRARY_PATH}"

exec mooncake_master \
    --port 50088 \
    --eviction_high_watermark_ratio 0.9 \
    --eviction_ratio 0.1 \
    --default_kv_lease_ttl 11000
