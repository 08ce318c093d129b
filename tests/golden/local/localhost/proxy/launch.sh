#!/usr/bin/env bash
# proxy on localhost (proxy) for deployment local.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/proxy.log.
cd "$(dirname "$0")/.." || exit 1
mkdir -p cache rpc tmp || exit 1
set -e
export PYTHONPATH="$PWD"/bundle/proxy${PYTHONPATH:+:"$PYTHONPATH"}

exec python3 \
    -m kvpd.proxy \
    --host 127.0.0.1 \
    --port 18000 \
    --prefiller-hosts 127.0.0.1 \
    --prefiller-ports 18100 \
    --decoder-hosts 127.0.0.1 \
    --decoder-ports 18200 \
    --flow prefill-first \
    --prefix-capacity-tokens 32768 \
    --admin-token-file proxy/admin-token \
    --shutdown-grace 15
