#!/usr/bin/env bash
# metaservice on p1 (metaservice) for deployment layerwise-sparse-1p1d.
# Rendered by kvpd; `kvpd up` runs it with its output in logs/metaservice.log.
cd "$(dirname "$0")/.." || exit 1
source /usr/local/memcache_hybrid/set_env.sh
source /usr/local/memfabric_hybrid/set_env.sh
set -e
export MMC_META_CONFIG_PATH=conf/mmc-meta.conf

exec python \
    -c 'from memcache_hybrid import MetaService; MetaService.main()'
