#!/usr/bin/env bash
# proxy on p1 (proxy) for deployment ucm-centralized-2p2d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/proxy.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export PYTHONPATH="$PWD"/bundle/proxy${PYTHONPATH:+:"$PYTHONPATH"}

exec python3 \
    -m kvpd.proxy \
    --host 0.0.0.0 \
    --port 7805 \
    --prefiller-hosts 192.168.10.1 192.168.10.1 \
    --prefiller-ports 7800 7801 \
    --decoder-hosts 192.168.10.2 192.168.10.2 \
    --decoder-ports 7802 7803 \
    --flow prefill-first \
    --admin-token-file proxy/admin-token \
    --shutdown-grace 15
