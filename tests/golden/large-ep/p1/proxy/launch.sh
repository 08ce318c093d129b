#!/usr/bin/env bash
# proxy on p1 (proxy) for deployment large-ep.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/proxy.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export PYTHONPATH="$PWD"/bundle/proxy${PYTHONPATH:+:"$PYTHONPATH"}

exec python3 \
    -m kvpd.proxy \
    --host 0.0.0.0 \
    --port 7850 \
    --prefiller-hosts 192.168.10.1 192.168.10.2 192.168.10.3 192.168.10.4 \
    --prefiller-ports 9000 9000 9000 9000 \
    --decoder-hosts 192.168.10.5 192.168.10.5 192.168.10.6 192.168.10.6 192.168.10.7 192.168.10.7 192.168.10.8 192.168.10.8 \
    --decoder-ports 9000 9001 9000 9001 9000 9001 9000 9001 \
    --flow prefill-first \
    --admin-token-file proxy/admin-token \
    --shutdown-grace 15
