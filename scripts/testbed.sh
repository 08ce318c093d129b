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
# ("hI address user forwarding" lines). Keys and per-host files survive `down`; rm -rf $DIR
# forgets them.
#
# TOPOLOGY=bastion: a bed like a cluster behind a login node (own defaults: DIR
# <repo>/.kvpd/testbed-bastion, PFX kvpdj, NET 10.216.0, EDGE 10.216.1, so it coexists with the
# open bed). The cluster hosts' bridge $PFX-br0 has no address in the root namespace and the
# root namespace has an `unreachable` route for $NET.0/24, so nothing from this machine reaches a
# cluster host, not even through the default route. The only way in is the bastion: netns
# $PFX-bastion with two links, eth0 $EDGE.10 on bridge $PFX-pub ($EDGE.1 here) where its sshd
# listens, and eth1 $NET.2 on the cluster bridge; it forwards no packets (ip_forward 0), only
# SSH channels. Its client files: $DIR/jump ("address user"), ssh_config entries with
# ProxyJump. NONROOT (default "2"): host indexes where logins are $BED_USER (uid 1500, home
# /home/$BED_USER private to the host, no sudo) instead of root; NOFORWARD (default ""): host
# indexes whose sshd has AllowTcpForwarding no. /home joins the private dirs; on a host with
# the non-root user, /root is 0711 so it can run the shared Python installed below /root.
# DIRECT=1 (benchmarks only) also gives this machine $NET.1 on the cluster bridge, so the same
# hosts can be timed through the bastion and directly in one run.
set -euo pipefail

REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
TOPOLOGY=${TOPOLOGY:-open}
case $TOPOLOGY in
  open) BED_DEFAULTS=(testbed kvpdt 10.213.0 "/root /tmp /var/log") ;;
  bastion) BED_DEFAULTS=(testbed-bastion kvpdj 10.216.0 "/root /tmp /var/log /home") ;;
  *) echo "testbed: TOPOLOGY must be open or bastion, not $TOPOLOGY" >&2; exit 2 ;;
esac
DIR=$(realpath -m -- "${KVPD_TESTBED_DIR:-$REPO/.kvpd/${BED_DEFAULTS[0]}}")
PFX=${PFX:-${BED_DEFAULTS[1]}}
NET=${NET:-${BED_DEFAULTS[2]}}
EDGE=${EDGE:-10.216.1}
PORT=${PORT:-22}
PRIVATE_DIRS=${PRIVATE_DIRS-${BED_DEFAULTS[3]}}
NONROOT=${NONROOT-2}
NOFORWARD=${NOFORWARD-}
BED_USER=${BED_USER:-kvpd}
BED_UID=1500
BR=$PFX-br0
PUB=$PFX-pub
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
if [ -n "${BED_LOGIN:-}" ]; then  # "user:uid": a login that is not root, in this host only
  u=${BED_LOGIN%%:*}; id=${BED_LOGIN##*:}
  { grep -v "^$u:" /run/real/etc/passwd; echo "$u:x:$id:$id:kvpd bed:/home/$u:/bin/sh"; } >"$hdir/passwd"
  { grep -v "^$u:" /run/real/etc/group; echo "$u:x:$id:"; } >"$hdir/group"
  mount --bind "$hdir/passwd" /etc/passwd
  mount --bind "$hdir/group" /etc/group
  mkdir -p "/home/$u/.ssh"
  cp "$AUTH_KEYS" "/home/$u/.ssh/authorized_keys"
  chown -R "$id:$id" "/home/$u"
  chmod 700 "/home/$u" "/home/$u/.ssh"
  chmod 711 /root  # traversable for the shared Python below it, not listable
fi
exec /usr/sbin/sshd -D -f "$hdir/sshd_config" -E "$hdir/sshd.log"
EOF
  chmod 755 "$DIR/hostinit.sh"
}

link() { # NS VETH IFNAME BRIDGE IP: a veth from bridge BRIDGE to IFNAME (IP/24) inside NS
  local ns=$1 veth=$2 dev=$3 br=$4 ip=$5
  if ! ip -n "$ns" link show "$dev" >/dev/null 2>&1; then
    ip link del "$veth" 2>/dev/null || true
    ip link add "$veth" type veth peer name "$dev" netns "$ns"
  fi
  ip link set "$veth" master "$br" up
  ip -n "$ns" addr replace "$ip/24" dev "$dev"
  ip -n "$ns" link set "$dev" up
}

close_fds() { # every descriptor of this (sub)shell above stderr
  local fd
  for fd in $(ls /proc/$BASHPID/fd); do
    [ "$fd" -gt 2 ] && eval "exec $fd>&-"
  done
  return 0
}

in_list() { local x; for x in $2; do [ "$x" = "$1" ] && return 0; done; return 1; }

host_up() { # $1 = index
  local i=$1 ip=$NET.$((10 + $1)) user=root fwd=yes
  if [ "$TOPOLOGY" = bastion ]; then
    in_list "$i" "$NONROOT" && user=$BED_USER
    in_list "$i" "$NOFORWARD" && fwd=no
  fi
  new_host "h$i" "$ip" "$fwd"
  link "$PFX-h$i" "$PFX-h${i}b" eth0 "$BR" "$ip"
  start_sshd "h$i" "$ip" "$user" "$fwd"
}

bastion_up() { # the login node: a link to this machine (eth0) and one to the cluster (eth1)
  local ns=$PFX-bastion
  new_host bastion "$EDGE.10" yes
  link "$ns" "$PFX-bpub" eth0 "$PUB" "$EDGE.10"
  link "$ns" "$PFX-bprv" eth1 "$BR" "$NET.2"
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=0
  start_sshd bastion "$EDGE.10" root yes
}

new_host() { # NAME IP FORWARD: namespace, host key and sshd_config
  local h=$1 ip=$2 fwd=$3 ns=$PFX-$1 hd=$DIR/$1
  mkdir -p "$hd"
  [ -e "/run/netns/$ns" ] || ip netns add "$ns"
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
    net.ipv6.conf.default.disable_ipv6=1 2>/dev/null || true
  ip -n "$ns" link set lo up
  [ -f "$hd/ssh_host_ed25519_key" ] ||
    ssh-keygen -q -t ed25519 -N '' -C "$h" -f "$hd/ssh_host_ed25519_key"
  cat >"$hd/sshd_config" <<EOF
ListenAddress $ip:$PORT
HostKey $hd/ssh_host_ed25519_key
PidFile none
AuthorizedKeysFile .ssh/authorized_keys $DIR/authorized_keys
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
AllowTcpForwarding $fwd
MaxStartups 64:30:128
MaxSessions 32
Subsystem sftp internal-sftp
EOF
}

start_sshd() { # NAME IP USER FORWARD: start the host's sshd (PID 1 of its namespaces) if down
  local h=$1 ip=$2 user=$3 fwd=$4 ns=$PFX-$1 hd=$DIR/$1 pid login=""
  [ "$user" = root ] || login="$user:$BED_UID"
  if ! sshd_pid "$h" >/dev/null || ! listening "$h"; then
    # A half-dead host (namespace without a listening sshd): clear its processes first.
    kill_pids $(ip netns pids "$ns" 2>/dev/null)
    # The host outlives this script: it must hold none of its descriptors, above all not the
    # lock of a caller's `flock /tmp/kvpd-bed.lock testbed.sh up`, which it would keep taken
    # until `down`.
    (
      close_fds
      PRIVATE_DIRS="$PRIVATE_DIRS" SHARED_DIRS="$SHARED_DIRS" BED_LOGIN="$login" \
        AUTH_KEYS="$DIR/authorized_keys" exec setsid ip netns exec "$ns" \
        unshare --uts --pid --mount --propagation private --kill-child --mount-proc \
        "$DIR/hostinit.sh" "$h" "$hd" </dev/null >>"$hd/sshd.log" 2>&1
    ) &
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
  local key
  key=$(cut -d' ' -f1,2 "$hd/ssh_host_ed25519_key.pub")
  echo "$h $ip $name $key $user $fwd" >>"$DIR/.hosts.new"
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
  bridge "$BR"
  : >"$DIR/.hosts.new"
  if [ "$TOPOLOGY" = bastion ]; then
    # This machine reaches the bastion only; the cluster prefix is unreachable from here,
    # whatever the default route says.
    bridge "$PUB"
    ip addr replace "$EDGE.1/24" dev "$PUB"
    if [ "${DIRECT:-}" = 1 ]; then  # benchmarks only: the same hosts, also reached directly
      ip route del unreachable "$NET.0/24" 2>/dev/null || true
      ip addr replace "$NET.1/24" dev "$BR"
    else
      ip route replace unreachable "$NET.0/24"
    fi
    bastion_up
  else
    ip addr replace "$NET.1/24" dev "$BR"
  fi
  hosts_down $(for ns in $(hosts_present); do [ "${ns##*-h}" -gt "$n" ] && echo "$ns"; done)
  for i in $(seq 1 "$n"); do host_up "$i"; done
  awk '{print $3, $4, $5}' "$DIR/.hosts.new" >"$DIR/known_hosts"
  local jump=""
  [ "$TOPOLOGY" = bastion ] && jump=bastion
  awk -v d="$DIR" -v p="$PORT" -v j="$jump" '{
    printf "Host %s\n  HostName %s\n  Port %s\n  User %s\n  IdentityFile %s/id_ed25519\n", $1, $2, p, $6, d
    printf "  IdentitiesOnly yes\n  UserKnownHostsFile %s/known_hosts\n  StrictHostKeyChecking yes\n", d
    if (j != "" && $1 != j) printf "  ProxyJump %s\n", j
    printf "\n"
  }' "$DIR/.hosts.new" >"$DIR/ssh_config"
  awk '$1 != "bastion" {print $1, $2, $6, $7}' "$DIR/.hosts.new" >"$DIR/hosts"
  if [ "$TOPOLOGY" = bastion ]; then
    awk '$1 == "bastion" {print $2, $6}' "$DIR/.hosts.new" >"$DIR/jump"
  fi
  rm -f "$DIR/.hosts.new"
  status
}

bridge() { # NAME: a bridge in this namespace (no address here unless the caller adds one)
  ip link show "$1" >/dev/null 2>&1 || ip link add "$1" type bridge
  sysctl -qw "net.ipv6.conf.$1.disable_ipv6=1" 2>/dev/null || true
  ip link set "$1" up
}

down() {
  need_root
  lock
  hosts_down $(hosts_present)
  if [ "$TOPOLOGY" = bastion ]; then
    hosts_down "$PFX-bastion"
    ip link del "$PFX-bpub" 2>/dev/null || true
    ip link del "$PFX-bprv" 2>/dev/null || true
    ip link del "$PUB" 2>/dev/null || true
    ip route del unreachable "$NET.0/24" 2>/dev/null || true
  fi
  ip link del "$BR" 2>/dev/null || true
  echo "testbed down (keys and host files kept in $DIR)"
}

status() {
  local ns h pid addr
  echo "dir:         $DIR   (shared: $SHARED_DIRS)"
  echo "ssh_config:  $DIR/ssh_config   e.g. ssh -F $DIR/ssh_config h1 hostname"
  echo "key:         $DIR/id_ed25519   known_hosts: $DIR/known_hosts   hosts: $DIR/hosts"
  local all
  all=$(hosts_present)
  [ "$TOPOLOGY" = bastion ] && [ -e "/run/netns/$PFX-bastion" ] && all="$PFX-bastion $all"
  for ns in $all; do
    h=${ns#"$PFX-"}
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
