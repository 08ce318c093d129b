#!/usr/bin/env bash
# Install the KV services that run on CPU (for rehearsals and their tests) into one venv:
# memcache-hybrid + memfabric-hybrid (the memcache MetaService) and the non-CUDA Mooncake wheel
# (mooncake_master), and NumPy: `--rehearse-with standin` runs kvpd's stand-in engines with this
# Python, and a stand-in sparse decode plans with kvpd's native planner, which needs NumPy as a
# real engine's venv has it. Idempotent: skips when the stamp matches this script.
#   KVPD_SERVICES_VENV  where (default: <repo>/.venv-services)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${KVPD_SERVICES_VENV:-$REPO/.venv-services}
PY=${PYTHON:-python3}
STAMP=$VENV/.kvpd-services-stamp
want=$(sha256sum "$0" | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/mooncake_master" ]; then
  echo "services venv up to date: $VENV"
  exit 0
fi
t0=$(date +%s)
# mooncake_master links libibverbs.so.1 even for TCP
if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null
  else
    echo "warning: libibverbs1 is missing; mooncake_master will not start (apt-get install libibverbs1)" >&2
  fi
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/pip" install -q 'memcache-hybrid>=1.3,<1.4' 'memfabric-hybrid>=1.3,<1.4' \
  'mooncake-transfer-engine-non-cuda>=0.3.13' 'numpy>=1.24' 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import memcache_hybrid" >/dev/null
"$VENV/bin/mooncake_master" --version >/dev/null 2>&1 || \
  echo "warning: mooncake_master --version failed (missing libibverbs1?)" >&2
echo "$want" > "$STAMP"
echo "services venv ready: $VENV ($(du -sh "$VENV" | cut -f1), $(( $(date +%s) - t0 )) s)"
