#!/usr/bin/env bash
# proxy on p1 (proxy) for deployment layerwise-sparse-1p1d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/proxy.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export PYTHONPATH="$PWD"/bundle/proxy${PYTHONPATH:+:"$PYTHONPATH"}

exec python3 \
    -m kvpd.proxy \
    --host 192.168.20.1 \
    --port 9000 \
    --prefiller-hosts 192.168.20.1 \
    --prefiller-ports 8100 \
    --decoder-hosts 192.168.20.2 \
    --decoder-ports 8200 \
    --flow layerwise \
    --admin-token-file proxy/admin-token \
    --shutdown-grace 15
