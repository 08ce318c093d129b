#!/usr/bin/env bash
# proxy on p1 (proxy) for deployment ucm-mooncake-2p2d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/proxy.log.
cd "$(dirname "$0")/.." || exit 1
set -e
export PYTHONPATH="$PWD"/bundle/proxy${PYTHONPATH:+:"$PYTHONPATH"}

exec python3 \
    -m kvpd.proxy \
    --host 0.0.0.0 \
    --port 7850 \
    --prefiller-hosts 192.168.10.1 192.168.10.1 \
    --prefiller-ports 9000 9001 \
    --decoder-hosts 192.168.10.2 192.168.10.2 \
    --decoder-ports 9000 9001 \
    --flow prefill-first \
    --admin-token-file proxy/admin-token \
    --shutdown-grace 15
