#!/usr/bin/env bash
# What the controller needs to build kvpd's native core for aarch64 hosts, and the tests to run
# it under emulation: the cross compiler, qemu's user-mode emulator, and an arm64 CPython 3.11
# with NumPy, pytest and hypothesis in a folder of its own (nothing of the system's Python is
# replaced). Idempotent: skips when the stamp matches this script.
#
# Layout of $KVPD_AARCH64_DIR (default: <repo>/.kvpd/aarch64):
#   root/          Debian's arm64 packages, unpacked (libc, CPython 3.11 and its headers), and
#                  arm64 wheels unpacked into its usr/lib/python3/dist-packages (NumPy, pip,
#                  pytest, hypothesis, pytest-timeout): where Debian's site finds them, so they
#                  are there with `python -I` too
#   bin/python3.11 runs root/usr/bin/python3.11 under qemu-aarch64-static (children too)
# qemu's -L prefix (QEMU_LD_PREFIX) makes every absolute path the emulated program opens resolve
# below root/ first, so the interpreter finds its own stdlib at /usr/lib/python3.11.
#
# Needs root and apt for the packages; elsewhere it says what is missing and exits 0, and the
# tests that need it skip saying why (CI fails them instead).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${KVPD_AARCH64_DIR:-$REPO/.kvpd/aarch64}
PY=${PYTHON:-$REPO/.venv/bin/python}
STAMP=$DIR/.stamp
want=$(sha256sum "$0" | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$DIR/bin/python3.11" ]; then
  echo "aarch64 toolchain and emulated Python up to date: $DIR"
  exit 0
fi
t0=$(date +%s)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-aarch64: needs root and apt-get (g++-aarch64-linux-gnu, qemu-user-static," \
    "arm64 packages); skipped: the aarch64 tests will skip" >&2
  exit 0
fi
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  updated=0
else
  updated=1
fi
if ((${#need[@]})) || [ "$updated" = 0 ] || ! apt-cache show python3.11-minimal:arm64 >/dev/null 2>&1; then
  apt-get update -qq
fi
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The arm64 interpreter and what it links, unpacked (not installed: the system keeps its own).
PKGS=(libc6 libgcc-s1 libstdc++6 libgomp1 libcrypt1 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0
  liblzma5 libuuid1 libpython3.11-minimal libpython3.11-stdlib python3.11-minimal
  libpython3.11-dev)
rm -rf "$DIR.tmp"
SITE=$DIR.tmp/root/usr/lib/python3/dist-packages
mkdir -p "$DIR.tmp/debs" "$DIR.tmp/root" "$DIR.tmp/wheels" "$DIR.tmp/bin" "$SITE"
# An empty folder in front of the system's /usr/local one: nothing of the controller's own
# Python packages (x86 modules) is seen by the emulated interpreter.
mkdir -p "$DIR.tmp/root/usr/local/lib/python3.11/dist-packages"
(cd "$DIR.tmp/debs" && apt-get download -qq "${PKGS[@]/%/:arm64}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
for deb in "$DIR.tmp"/debs/*.deb; do dpkg -x "$deb" "$DIR.tmp/root"; done

# Wheels at the versions the controller's venv runs, for the same tests on both sides.
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
"$PY" -m pip download -q --only-binary=:all: --platform manylinux_2_28_aarch64 \
  --platform manylinux2014_aarch64 --python-version 3.11 --implementation cp --abi cp311 \
  -d "$DIR.tmp/wheels" "numpy==$(ver numpy)" "pytest==$(ver pytest)" "pip==$(ver pip)" \
  "hypothesis==$(ver hypothesis)" "pytest-timeout==$(ver pytest-timeout)" 2>&1 |
  grep -v '^WARNING: Location' || true
for whl in "$DIR.tmp"/wheels/*.whl; do "$PY" -m zipfile -e "$whl" "$SITE"; done

# The wrapper: qemu's -0 sets argv[0], so sys.executable is this wrapper and a test's
# subprocess of sys.executable runs emulated too (no binfmt_misc needed).
cat >"$DIR.tmp/bin/python3.11" <<EOF
#!/bin/sh
# arm64 CPython 3.11 under qemu user-mode emulation (made by scripts/install-aarch64.sh).
export QEMU_LD_PREFIX="$DIR/root"
exec qemu-aarch64-static -0 "$DIR/bin/python3.11" "$DIR/root/usr/bin/python3.11" "\$@"
EOF
chmod 0755 "$DIR.tmp/bin/python3.11"
rm -rf "$DIR.tmp/debs" "$DIR.tmp/wheels" "$DIR"
mv "$DIR.tmp" "$DIR"
"$DIR/bin/python3.11" -I -c 'import platform, numpy, pip; assert platform.machine() == "aarch64"'
echo "$want" >"$STAMP"
echo "aarch64 toolchain and emulated Python ready: $DIR ($(du -sh "$DIR" | cut -f1), $(($(date +%s) - t0)) s)"
