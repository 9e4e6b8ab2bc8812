#!/bin/sh
# Runcrate bootstrap: make this host node-i of a cluster (clusters/machines/ssh.py runs it).
#
# The driver uploads the node plan into $INCOMING (default /var/lib/runcrate/incoming) as files
# (plan.env, hosts, environment, hostfile, authorized_keys, known_hosts, cluster_key[.pub],
# agent.json, runcrate_agent.py) and runs this script as root. It is idempotent: each change it
# makes prints one "runcrate: changed WHAT" line, and a second run prints none. The last line is
# "runcrate: ok" or "runcrate: refused: WHY" (exit 3, nothing changed) or "runcrate: failed: WHY".
#
# Supported: Debian 12, Ubuntu 22.04 and 24.04. It installs only what is missing (python3,
# iproute2, wireguard-tools, wireguard-go where the kernel has no WireGuard, nftables, iperf3 if
# it can), from the location's APT_MIRROR only; a host imaged with everything needs no package
# source. The node's firewall (nftables table `inet runcrate`) keeps the private network private:
# 10.77.0.0/24 only over rc0, and inbound on the public interface only sshd and WireGuard from
# the cluster's own peers (docs/security.md, "Each node's firewall").
set -eu
umask 022
INCOMING="${INCOMING:-/var/lib/runcrate/incoming}"
STATE=/var/lib/runcrate
CONF=/etc/runcrate
IFACE=rc0
BEGIN="# BEGIN runcrate"
END="# END runcrate"

say() { echo "runcrate: $*"; }
refuse() { say "refused: $*"; exit 3; }
fail() { say "failed: $*"; exit 4; }

[ "$(id -u)" = 0 ] || refuse "the bootstrap must run as root (or through sudo)"
[ -f "$INCOMING/plan.env" ] || refuse "no node plan in $INCOMING"
# shellcheck disable=SC1091
. "$INCOMING/plan.env"

# --- the operating system ---------------------------------------------------------------------
[ -r /etc/os-release ] || refuse "no /etc/os-release: cannot tell which system this is"
OS_ID=$(. /etc/os-release; echo "${ID:-}")
OS_VERSION=$(. /etc/os-release; echo "${VERSION_ID:-}")
CODENAME=$(. /etc/os-release; echo "${VERSION_CODENAME:-}")
case "$OS_ID $OS_VERSION" in
  "debian 12"|"ubuntu 22.04"|"ubuntu 24.04") ;;
  *) refuse "$OS_ID $OS_VERSION is not supported; Runcrate hosts run Debian 12, Ubuntu 22.04 or Ubuntu 24.04" ;;
esac
say "os=$OS_ID-$OS_VERSION"

# --- what is missing, from the location's mirror only ------------------------------------------
kernel_wireguard() {
  command -v ip >/dev/null 2>&1 || return 1
  if ip link add rc-probe type wireguard >/dev/null 2>&1; then
    ip link del rc-probe >/dev/null 2>&1 || true
    return 0
  fi
  return 1
}
missing=""
command -v python3 >/dev/null 2>&1 || missing="$missing python3"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v wg >/dev/null 2>&1 || missing="$missing wireguard-tools"
if kernel_wireguard; then WG_MODE=kernel; else WG_MODE=wireguard-go; fi
[ "$WG_MODE" = kernel ] || command -v wireguard-go >/dev/null 2>&1 || missing="$missing wireguard-go"
command -v nft >/dev/null 2>&1 || missing="$missing nftables"
optional=""
command -v iperf3 >/dev/null 2>&1 || optional="iperf3"
# /shared (SHARED_ROLE export on node-0, mount on the others, empty on containers): NFS where
# the kernels have it, else sshfs, which needs only the head's sshd (docs/drivers.md).
SHARED_ROLE="${SHARED_ROLE:-}"
SHARED_DIR="${SHARED_DIR:-/shared}"
has_fs() { grep -qw "$1" /proc/filesystems 2>/dev/null; }
if [ "$SHARED_ROLE" = mount ] && ! command -v sshfs >/dev/null 2>&1; then
  if has_fs nfs4 && command -v mount.nfs4 >/dev/null 2>&1; then
    optional="$optional sshfs"
  else
    missing="$missing sshfs"
  fi
fi
if [ "${VOLUME_SYNC:-}" = 1 ] && ! command -v rsync >/dev/null 2>&1; then
  missing="$missing rsync"
fi
if [ "$SHARED_ROLE" = export ] && has_fs nfsd && ! command -v exportfs >/dev/null 2>&1; then
  optional="$optional nfs-kernel-server"
fi
if [ -n "$missing$optional" ] && [ -n "${APT_MIRROR:-}" ]; then
  list=/etc/apt/sources.list.d/runcrate.list
  line="deb $APT_MIRROR $CODENAME main"
  if [ "$(cat "$list" 2>/dev/null)" != "$line" ]; then
    echo "$line" > "$list"
    say "changed apt-source"
  fi
  # dpkg without an fsync per file (--force-unsafe-io): a host that loses power half-way fails
  # its cluster's step and is reimaged before anyone else gets it, so the syncs protect nothing.
  apt_opts="-o Dir::Etc::sourcelist=$list -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 -o Dpkg::Options::=--force-unsafe-io"
  # Quietly, with the options above; its exit status is apt-get's.
  # shellcheck disable=SC2086
  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get $apt_opts -qq "$@" >/dev/null 2>&1; }
  apt_install() { apt_get install -y --no-install-recommends "$@"; }
  apt_get update || fail "apt-get update from $APT_MIRROR failed"
  # Everything in one apt-get (one resolution, one dpkg run: each costs the host's CPU, and a
  # big cluster's hosts bootstrap side by side); where that fails (an optional package the
  # mirror lacks), the needed packages alone, then each optional one by itself.
  # shellcheck disable=SC2086
  if [ -n "$missing" ] && [ -n "$optional" ] && apt_install $missing $optional; then
    say "changed packages$missing $optional"
    optional=""
  elif [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    apt_install $missing || fail "could not install$missing from $APT_MIRROR"
    say "changed packages$missing"
  fi
  for package in $optional; do
    if apt_install "$package"; then say "changed packages $package"; fi
  done
elif [ -n "$missing" ]; then
  refuse "this host lacks$missing and its location has no apt_mirror to install from"
fi
mkdir -p "$STATE" "$CONF"
chmod 700 "$CONF"
if [ -n "${PIP_INDEX_URL:-}" ] && { [ ! -e /etc/pip.conf ] || [ -e "$STATE/pip-conf" ]; }; then
  pipconf="[global]
index-url = $PIP_INDEX_URL"
  if [ "$(cat /etc/pip.conf 2>/dev/null)" != "$pipconf" ]; then
    echo "$pipconf" > /etc/pip.conf
    touch "$STATE/pip-conf"
    say "changed pip-index"
  fi
fi

# --- a managed block in a file: replaced only when it differs ----------------------------------
block() {  # block FILE CONTENT-FILE WHAT [MODE]
  file=$1; content=$2; what=$3
  [ -f "$file" ] || { : > "$file"; [ -z "${4:-}" ] || chmod "$4" "$file"; }
  current=$(awk -v b="$BEGIN" -v e="$END" '$0==b{on=1;next} $0==e{on=0;next} on' "$file")
  if [ "$current" != "$(cat "$content")" ] || ! grep -qx "$BEGIN" "$file"; then
    tmp="$file.runcrate.$$"
    awk -v b="$BEGIN" -v e="$END" '$0==b{on=1;next} $0==e{on=0;next} !on' "$file" > "$tmp"
    { echo "$BEGIN"; cat "$content"; echo "$END"; } >> "$tmp"
    cat "$tmp" > "$file"; rm -f "$tmp"
    say "changed $what"
  fi
}
install_file() {  # install_file SRC DEST MODE WHAT
  if ! cmp -s "$1" "$2" 2>/dev/null; then
    mkdir -p "$(dirname "$2")"
    cp "$1" "$2.runcrate.$$"; chmod "$3" "$2.runcrate.$$"; mv "$2.runcrate.$$" "$2"
    say "changed $4"
  fi
}

# --- hostname, /etc/hosts, the environment ----------------------------------------------------
[ -f "$STATE/original-hostname" ] || hostname > "$STATE/original-hostname"
say "original_hostname=$(cat "$STATE/original-hostname")"
if [ "$(hostname)" != "$NODE_NAME" ] || [ "$(cat /etc/hostname 2>/dev/null)" != "$NODE_NAME" ]; then
  echo "$NODE_NAME" > /etc/hostname
  hostname "$NODE_NAME"
  say "changed hostname"
fi
block /etc/hosts "$INCOMING/hosts" hosts
block /etc/environment "$INCOMING/environment" environment

# --- SSH: the user's keys, the cluster's key pair, the peers' pinned host keys -----------------
LOGIN_HOME=$(getent passwd "$LOGIN_USER" | cut -d: -f6)
[ -n "$LOGIN_HOME" ] || refuse "no user $LOGIN_USER on this host"
mkdir -p "$LOGIN_HOME/.ssh"; chmod 700 "$LOGIN_HOME/.ssh"
block "$LOGIN_HOME/.ssh/authorized_keys" "$INCOMING/authorized_keys" authorized-keys 600
# The private key's file differs on every upload (OpenSSH's format has a random check field)
# for the same key: it is replaced only when the public half changes.
if ! cmp -s "$INCOMING/cluster_key.pub" "$LOGIN_HOME/.ssh/runcrate_cluster.pub" 2>/dev/null \
  || [ ! -s "$LOGIN_HOME/.ssh/runcrate_cluster" ]; then
  install_file "$INCOMING/cluster_key" "$LOGIN_HOME/.ssh/runcrate_cluster" 600 cluster-key
  install_file "$INCOMING/cluster_key.pub" "$LOGIN_HOME/.ssh/runcrate_cluster.pub" 644 \
    cluster-key-pub
fi
printf 'Host node-* 10.77.0.*\n    IdentityFile %s/.ssh/runcrate_cluster\n    StrictHostKeyChecking yes\n' \
  "$LOGIN_HOME" > "$INCOMING/ssh_config"
block "$LOGIN_HOME/.ssh/config" "$INCOMING/ssh_config" ssh-config 600
mkdir -p /etc/ssh
block /etc/ssh/ssh_known_hosts "$INCOMING/known_hosts" known-hosts 644
chown -R "$LOGIN_USER" "$LOGIN_HOME/.ssh" 2>/dev/null || true

# --- /shared and the hostfile in it -----------------------------------------------------------
# node-0 keeps the folder (its workers' agents mount it once the private network is up) and
# exports it over NFS where its kernel serves NFS; sshfs needs nothing more than its sshd.
if [ "$SHARED_ROLE" = export ]; then
  [ -d "$SHARED_DIR" ] || { mkdir -p "$SHARED_DIR"; chmod 1777 "$SHARED_DIR"; say "changed shared-folder"; }
  if has_fs nfsd && command -v exportfs >/dev/null 2>&1; then
    echo "$SHARED_DIR 10.77.0.0/24(rw,sync,no_subtree_check,no_root_squash)" > "$INCOMING/exports"
    block /etc/exports "$INCOMING/exports" nfs-export 644
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      systemctl enable --now nfs-server >/dev/null 2>&1 || true
    else
      pgrep -x nfsd >/dev/null 2>&1 || rpc.nfsd 8 >/dev/null 2>&1 || true
      pgrep -x rpc.mountd >/dev/null 2>&1 || rpc.mountd >/dev/null 2>&1 || true
    fi
    exportfs -ra >/dev/null 2>&1 || fail "exportfs could not export $SHARED_DIR"
    say "shared=nfs"
  else
    say "shared=sshfs"
  fi
fi
mkdir -p "$(dirname "$HOSTFILE_PATH")"
install_file "$INCOMING/hostfile" "$HOSTFILE_PATH" 644 hostfile

# --- the firewall: the private network only over rc0, the public side closed but for sshd ------
# One table of our own (inet runcrate), replaced whole and atomically (nft -f) only when what it
# should be differs: 10.77.0.0/24 only over rc0 (and k3s's pod network on top of it), and on
# every other interface inbound only established traffic, sshd, ICMP, and WireGuard from the
# cluster's own peers (the set wg_peers, filled here from the plan and kept equal to the peers'
# endpoints by the agent). Outbound stays open. An operator opens more with rules in
# /etc/runcrate-firewall.d/*.nft, included in the input chain (docs/security.md).
FIREWALL_DROPINS=/etc/runcrate-firewall.d
ssh_ports=$(sshd -T 2>/dev/null | awk '$1 == "port" {print $2}' | sort -nu | tr '\n' ' ')
ssh_ports=$(echo "${ssh_ports:-22}" | sed 's/ *$//; s/ /, /g')
peers4=""; peers6=""
for peer in ${WG_PEERS:-}; do
  case "$peer" in
    *:*) peers6="${peers6:+$peers6, }$peer" ;;
    *[!0-9.]*) ;;  # a name, not an address: the agent adds what it resolves to
    *) peers4="${peers4:+$peers4, }$peer" ;;
  esac
done
elements4=""; elements6=""
[ -z "$peers4" ] || elements4=" elements = { $peers4 };"
[ -z "$peers6" ] || elements6=" elements = { $peers6 };"
dropins=$(cat "$FIREWALL_DROPINS"/*.nft 2>/dev/null | sha256sum | cut -d' ' -f1)
{
  echo "# Written by runcrate (bootstrap.sh): $NODE_NAME's firewall (docs/security.md)."
  echo "# Drop-ins from $FIREWALL_DROPINS: $dropins"
  echo 'define private = { "lo", "rc0", "cni0", "flannel.1" }'
  echo 'define cluster = 10.77.0.0/24'
  echo 'table inet runcrate'
  echo 'delete table inet runcrate'
  echo 'table inet runcrate {'
  echo "  set wg_peers { type ipv4_addr;$elements4 }"
  echo "  set wg_peers6 { type ipv6_addr;$elements6 }"
  echo '  chain input {'
  echo '    type filter hook input priority filter; policy drop;'
  echo '    iifname "lo" accept'
  echo '    iifname != $private ip saddr $cluster drop'
  echo '    iifname != $private ip daddr $cluster drop'
  echo '    iifname $private accept'
  echo '    ct state established,related accept'
  echo '    ct state invalid drop'
  echo "    tcp dport { $ssh_ports } accept"
  echo "    udp dport $WG_PORT ip saddr @wg_peers accept"
  echo "    udp dport $WG_PORT ip6 saddr @wg_peers6 accept"
  echo '    icmp type { echo-request, destination-unreachable, time-exceeded, parameter-problem } limit rate 20/second accept'
  echo '    icmpv6 type { echo-request, destination-unreachable, packet-too-big, time-exceeded, parameter-problem, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } accept'
  echo "    include \"$FIREWALL_DROPINS/*.nft\""
  echo '  }'
  echo '  chain forward {'
  echo '    type filter hook forward priority filter; policy accept;'
  echo '    iifname != $private ip saddr $cluster drop'
  echo '    iifname != $private ip daddr $cluster drop'
  echo '    oifname != $private ip saddr $cluster drop'
  echo '    oifname != $private ip daddr $cluster drop'
  echo '  }'
  echo '  chain output {'
  echo '    type filter hook output priority filter; policy accept;'
  echo '    oifname != $private ip saddr $cluster drop'
  echo '    oifname != $private ip daddr $cluster drop'
  echo '  }'
  echo '}'
} > "$INCOMING/firewall.nft"
if ! cmp -s "$INCOMING/firewall.nft" "$CONF/firewall.nft" 2>/dev/null \
  || ! nft list table inet runcrate >/dev/null 2>&1; then
  why=$(nft -f "$INCOMING/firewall.nft" 2>&1) \
    || fail "nft could not load the firewall (is a rule in $FIREWALL_DROPINS wrong?): $(echo "$why" | head -n 3)"
  install_file "$INCOMING/firewall.nft" "$CONF/firewall.nft" 600 firewall-file >/dev/null
  say "changed firewall"
fi

# --- the private network: WireGuard, the key made here and never sent anywhere -----------------
mkdir -p "$CONF/wireguard"; chmod 700 "$CONF/wireguard"
if [ ! -s "$CONF/wireguard/private.key" ]; then
  (umask 077; wg genkey > "$CONF/wireguard/private.key")
  say "changed wireguard-key"
fi
if ! ip link show "$IFACE" >/dev/null 2>&1; then
  if [ "$WG_MODE" = kernel ]; then
    ip link add "$IFACE" type wireguard
  else
    WG_QUICK_USERSPACE_IMPLEMENTATION=wireguard-go wireguard-go "$IFACE" >/dev/null 2>&1 \
      || fail "wireguard-go could not create $IFACE (is /dev/net/tun there?)"
  fi
  say "changed wireguard-interface"
fi
if [ "$(wg show "$IFACE" listen-port 2>/dev/null)" != "$WG_PORT" ] \
  || [ "$(wg show "$IFACE" private-key 2>/dev/null)" != "$(cat "$CONF/wireguard/private.key")" ]; then
  wg set "$IFACE" listen-port "$WG_PORT" private-key "$CONF/wireguard/private.key"
  say "changed wireguard-config"
fi
if ! ip -o -4 addr show dev "$IFACE" | grep -q " $PRIVATE_IP/24 "; then
  ip addr flush dev "$IFACE"
  ip addr add "$PRIVATE_IP/24" dev "$IFACE"
  say "changed private-address"
fi
if ! ip link show "$IFACE" | grep -q "[<,]UP[,>]"; then
  ip link set "$IFACE" up
  say "changed wireguard-up"
fi
say "wireguard=$WG_MODE"
say "wireguard_public_key=$(wg show "$IFACE" public-key)"

# --- the agent: a systemd unit where systemd runs, otherwise a daemon with a pidfile -----------
install_file "$INCOMING/runcrate_agent.py" /opt/runcrate/runcrate_agent.py 755 agent
agent_changed=0
if ! cmp -s "$INCOMING/agent.json" "$CONF/agent.json" 2>/dev/null; then agent_changed=1; fi
install_file "$INCOMING/agent.json" "$CONF/agent.json" 600 agent-config
AGENT="/opt/runcrate/runcrate_agent.py"
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  unit=/etc/systemd/system/runcrate-agent.service
  printf '[Unit]\nDescription=Runcrate cluster agent\nAfter=network-online.target\n\n[Service]\nExecStart=/usr/bin/python3 %s\nRestart=always\nRestartSec=5\n\n[Install]\nWantedBy=multi-user.target\n' \
    "$AGENT" > "$INCOMING/unit"
  install_file "$INCOMING/unit" "$unit" 644 agent-unit
  systemctl daemon-reload
  if [ "$agent_changed" = 1 ] || ! systemctl is-active --quiet runcrate-agent; then
    systemctl enable --now runcrate-agent >/dev/null 2>&1
    systemctl restart runcrate-agent
    say "changed agent-running"
  fi
  say "agent=systemd"
else
  pidfile=/run/runcrate-agent.pid
  running=0
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then running=1; fi
  if [ "$running" = 1 ] && [ "$agent_changed" = 1 ]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    i=0; while kill -0 "$(cat "$pidfile" 2>/dev/null || echo 0)" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    running=0
  fi
  if [ "$running" = 0 ]; then
    python3 "$AGENT" --daemon --pidfile "$pidfile" --log-file /var/log/runcrate-agent.log
    say "changed agent-running"
  fi
  say "agent=daemon"
fi
say "ok"
