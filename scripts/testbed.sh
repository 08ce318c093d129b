#!/usr/bin/env bash
# testbed.sh - a multi-host SSH test bed on one Linux machine (root only).
#
#   scripts/testbed.sh up [N]   create or repair hosts h1..hN (default 4; idempotent)
#   scripts/testbed.sh down     power every host off (by the PIDs inside its namespaces)
#   scripts/testbed.sh status   hosts, addresses, sshd state
#
# Host I is network namespace $PFX-hI, eth0 = $NET.(10+I)/24, attached by a veth pair to the
# bridge $PFX-br0 ($NET.1 in the root namespace). No default route and no forwarding: packets
# never leave the bridge. Its sshd is PID 1 of its own PID+UTS+mount namespace (hostname hI,
# own PIDs, orphans reaped at once, everything killed when sshd dies) with private /run,
# /dev/shm (tmpfs) and $PRIVATE_DIRS (bind mounts of $DIR/hI/fs/...). $SHARED_DIRS are re-bound
# from the real tree after that, so they stay shared even when they live below a private dir.
#
# Env (defaults):
#   KVPD_TESTBED_DIR  <repo>/.kvpd/testbed   keys, configs and per-host files
#   PFX kvpdt   NET 10.213.0   PORT 22
#   PRIVATE_DIRS  "/root /tmp /var/log"
#   SHARED_DIRS   "$KVPD_TESTBED_DIR <repo> <realpath of sys.base_prefix of each Python>"
#                 Pythons: $PYTHON, <repo>/.venv/bin/python, python3, $EXTRA_PYTHONS (e.g. a
#                 second Python version for the node-bundle test). Space-separated paths.
# The repo is shared, but no host imports kvpd from it: hosts log in to their private /root and
# the engine venv has no kvpd (install-engine.sh); kvpd reaches a host only as the node bundle.
# Client files: $DIR/id_ed25519, $DIR/known_hosts, $DIR/ssh_config (ssh -F ... h1), $DIR/hosts
# ("hI address" lines). Keys and per-host files survive `down`; rm -rf $DIR forgets them.
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
DIR=$(realpath -m -- "${KVPD_TESTBED_DIR:-$REPO/.kvpd/testbed}")
PFX=${PFX:-kvpdt}
NET=${NET:-10.213.0}
PORT=${PORT:-22}
PRIVATE_DIRS=${PRIVATE_DIRS-/root /tmp /var/log}
BR=$PFX-br0
SSHD=/usr/sbin/sshd

die() { echo "testbed: $*" >&2; exit 1; }

python_homes() { # real installation dirs of the Pythons tests may run inside the hosts
  local py
  for py in ${PYTHON:-} "$REPO/.venv/bin/python" python3 ${EXTRA_PYTHONS:-}; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c 'import os, sys; print(os.path.realpath(sys.base_prefix))' 2>/dev/null || true
  done | sort -u
}
if [ -z "${SHARED_DIRS+set}" ]; then
  SHARED_DIRS="$DIR $REPO $(python_homes | tr '\n' ' ')"
fi
# Parents before children, so a nested shared dir is bound on top of its parent's bind. The path
# is a sort key too: `sort -n -u` alone dropped a different dir of the same length.
SHARED_DIRS=$(for d in $SHARED_DIRS; do echo "$d"; done | awk '{print length, $0}' |
  sort -k1,1n -k2 -u | cut -d' ' -f2- | tr '\n' ' ')

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, mounts)"; }

deps() {
  if command -v ip >/dev/null && command -v ss >/dev/null && [ -x "$SSHD" ] &&
    command -v ssh-keygen >/dev/null && command -v unshare >/dev/null &&
    command -v flock >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || die "need iproute2, openssh-server and util-linux installed"
  echo "testbed: installing openssh-server iproute2 ..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    openssh-server openssh-client iproute2 util-linux >/dev/null
}

lock() { mkdir -p "$DIR"; chmod 700 "$DIR"; exec 9>"$DIR/.lock"; flock 9; }

hosts_present() { # our netns names, by index
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PFX-h[0-9]+\$" | sort -V || true
}

sshd_pid() { # $1 = hI: host-side PID of its sshd listener, found among the netns PIDs
  local p cmd
  for p in $(ip netns pids "$PFX-$1" 2>/dev/null); do
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
    case $cmd in "sshd: "*"$DIR/$1/sshd_config"*) echo "$p"; return 0 ;; esac
  done
  return 1
}

listening() { # $1 = hI
  ip netns exec "$PFX-$1" ss -Htln "sport = :$PORT" 2>/dev/null | grep -q .
}

write_hostinit() {
  # Runs as PID 1 of the host's PID namespace, then becomes sshd. Gets PRIVATE_DIRS and
  # SHARED_DIRS from the environment.
  cat >"$DIR/hostinit.sh" <<'EOF'
#!/bin/sh
# hostinit.sh NAME HOSTDIR SSHD_CONFIG
set -e
name=$1; hdir=$2
hostname "$name"
for d in $PRIVATE_DIRS; do  # before any mount: $hdir itself may lie below a private dir
  mkdir -p "$hdir/fs$d"
  case $d in /tmp) chmod 1777 "$hdir/fs$d" ;; /root) chmod 700 "$hdir/fs$d" ;; esac
done
mount -t tmpfs -o mode=755,size=16m "$name-run" /run
mkdir -p /run/sshd /run/real
mount --rbind / /run/real                      # the real tree, reachable below the overlays
mount -t tmpfs -o mode=1777,size=1g "$name-shm" /dev/shm
for d in $PRIVATE_DIRS; do mount --bind "/run/real$hdir/fs$d" "$d"; done
for d in $SHARED_DIRS; do
  [ -d "/run/real$d" ] || continue
  mkdir -p "$d"
  mount --bind "/run/real$d" "$d"
done
exec /usr/sbin/sshd -D -f "$hdir/sshd_config" -E "$hdir/sshd.log"
EOF
  chmod 755 "$DIR/hostinit.sh"
}

host_up() { # $1 = index
  local i=$1 h=h$1 ns=$PFX-h$1 veth=$PFX-h$1b ip=$NET.$((10 + $1)) hd=$DIR/h$1 pid
  mkdir -p "$hd"
  [ -e "/run/netns/$ns" ] || ip netns add "$ns"
  if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    ip link del "$veth" 2>/dev/null || true
    ip link add "$veth" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$veth" master "$BR" up
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
    net.ipv6.conf.default.disable_ipv6=1 2>/dev/null || true
  ip -n "$ns" addr replace "$ip/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  [ -f "$hd/ssh_host_ed25519_key" ] ||
    ssh-keygen -q -t ed25519 -N '' -C "$h" -f "$hd/ssh_host_ed25519_key"
  cat >"$hd/sshd_config" <<EOF
ListenAddress $ip:$PORT
HostKey $hd/ssh_host_ed25519_key
PidFile none
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding yes
MaxStartups 64:30:128
MaxSessions 32
Subsystem sftp internal-sftp
EOF
  if ! sshd_pid "$h" >/dev/null || ! listening "$h"; then
    # A half-dead host (namespace without a listening sshd): clear its processes first.
    kill_pids $(ip netns pids "$ns" 2>/dev/null)
    PRIVATE_DIRS="$PRIVATE_DIRS" SHARED_DIRS="$SHARED_DIRS" setsid ip netns exec "$ns" \
      unshare --uts --pid --mount --propagation private --kill-child --mount-proc \
      "$DIR/hostinit.sh" "$h" "$hd" </dev/null >>"$hd/sshd.log" 2>&1 9>&- &
    for _ in $(seq 200); do
      sshd_pid "$h" >/dev/null && listening "$h" && break
      sleep 0.05
    done
    sshd_pid "$h" >/dev/null && listening "$h" || die "sshd of $h did not start; see $hd/sshd.log"
  fi
  pid=$(sshd_pid "$h")
  echo "$pid" >"$hd/sshd.pid"
  local name=$ip
  [ "$PORT" = 22 ] || name="[$ip]:$PORT"
  echo "$h $ip $name $(cut -d' ' -f1,2 "$hd/ssh_host_ed25519_key.pub")" >>"$DIR/.hosts.new"
}

kill_pids() { # TERM the given PIDs, KILL what is left after 5 s, wait until all are gone
  [ $# -gt 0 ] || return 0
  local p left n
  kill -TERM "$@" 2>/dev/null || true
  for n in $(seq 100); do
    left=""
    for p in "$@"; do [ -e "/proc/$p" ] && left="$left $p"; done
    [ -z "$left" ] && return 0
    [ "$n" = 50 ] && { kill -KILL $left 2>/dev/null || true; }
    sleep 0.1
  done
  echo "testbed: PIDs still present: $left" >&2
}

hosts_down() { # $@ = netns names. sshd is PID 1 of each host: when it dies, the kernel kills
  # everything else in that host. The PIDs come from the namespaces, never from names.
  [ $# -gt 0 ] || return 0
  local ns
  kill_pids $(for ns in "$@"; do ip netns pids "$ns" 2>/dev/null; done)
  for ns in "$@"; do
    ip netns del "$ns" 2>/dev/null || true
    ip link del "${ns}b" 2>/dev/null || true
    rm -f "$DIR/${ns#"$PFX-"}/sshd.pid"
  done
}

up() {
  local n=${1:-4} i ns
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "bad host count: $n (1..200)"
  need_root
  deps
  lock
  write_hostinit
  [ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C kvpd-testbed -f "$DIR/id_ed25519"
  chmod 600 "$DIR/id_ed25519"
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  ip link show "$BR" >/dev/null 2>&1 || ip link add "$BR" type bridge
  sysctl -qw "net.ipv6.conf.$BR.disable_ipv6=1" 2>/dev/null || true
  ip addr replace "$NET.1/24" dev "$BR"
  ip link set "$BR" up
  hosts_down $(for ns in $(hosts_present); do [ "${ns##*-h}" -gt "$n" ] && echo "$ns"; done)
  : >"$DIR/.hosts.new"
  for i in $(seq 1 "$n"); do host_up "$i"; done
  awk '{print $3, $4, $5}' "$DIR/.hosts.new" >"$DIR/known_hosts"
  awk -v d="$DIR" -v p="$PORT" '{
    printf "Host %s\n  HostName %s\n  Port %s\n  User root\n  IdentityFile %s/id_ed25519\n", $1, $2, p, d
    printf "  IdentitiesOnly yes\n  UserKnownHostsFile %s/known_hosts\n  StrictHostKeyChecking yes\n\n", d
  }' "$DIR/.hosts.new" >"$DIR/ssh_config"
  awk '{print $1, $2}' "$DIR/.hosts.new" >"$DIR/hosts"
  rm -f "$DIR/.hosts.new"
  status
}

down() {
  need_root
  lock
  hosts_down $(hosts_present)
  ip link del "$BR" 2>/dev/null || true
  echo "testbed down (keys and host files kept in $DIR)"
}

status() {
  local ns h pid addr
  echo "dir:         $DIR   (shared: $SHARED_DIRS)"
  echo "ssh_config:  $DIR/ssh_config   e.g. ssh -F $DIR/ssh_config h1 hostname"
  echo "key:         $DIR/id_ed25519   known_hosts: $DIR/known_hosts   hosts: $DIR/hosts"
  for ns in $(hosts_present); do
    h=h${ns##*-h}
    addr=$(ip -n "$ns" -4 -br addr show eth0 2>/dev/null | awk '{print $3}')
    if pid=$(sshd_pid "$h") && listening "$h"; then
      printf '%-5s %-16s port %-5s netns %-12s sshd up (host pid %s)\n' "$h" "$addr" "$PORT" "$ns" "$pid"
    else
      printf '%-5s %-16s port %-5s netns %-12s sshd DOWN\n' "$h" "$addr" "$PORT" "$ns"
    fi
  done
}

case "${1:-}" in
  up) up "${2:-4}" ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up [N] | down | status" >&2; exit 2 ;;
esac
