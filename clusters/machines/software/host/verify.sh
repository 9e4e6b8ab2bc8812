#!/bin/sh
# Runcrate verify: after wipe.sh, over a new connection, list anything the bootstrap left.
# Prints "leftover: WHAT" per finding and exits 1 if there is any; prints "runcrate: clean" and
# exits 0 otherwise. Usage: verify.sh LOGIN_USER EXPECTED_HOSTNAME (clusters/machines/ssh.py
# prepends cluster-processes.sh).
LOGIN_USER="${1:-root}"
EXPECTED_HOSTNAME="${2:-}"
found=0
left() { echo "leftover: $*"; found=1; }

pgrep -f '/opt/runcrate/[r]uncrate_agent.py' >/dev/null 2>&1 && left "the agent is still running"
pgrep -f "wireguard-go [r]c0" >/dev/null 2>&1 && left "wireguard-go is still running"
for daemon in slurmd slurmctld munged; do
  pgrep -x "$daemon|$daemon-wlm" >/dev/null 2>&1 && left "$daemon is still running"
done
[ -e /etc/munge/munge.key ] && left "/etc/munge/munge.key"
pgrep -f '/opt/runcrate/[r]ay/|[r]aylet|[g]cs_server' >/dev/null 2>&1 && left "Ray is still running"
[ -e /tmp/ray ] && left "/tmp/ray"
[ -L /usr/local/bin/ray ] && left "/usr/local/bin/ray"
[ -e "$(getent passwd root | cut -d: -f6)/.ray/auth_token" ] && left "Ray's token in ~/.ray"
grep -qs " /shared " /proc/mounts && left "/shared is still mounted"
# /shared's session: sshfs and its `ssh … -s sftp` on a worker, sftp-server on node-0, and any
# SSH connection over the private network.
pgrep -f '[s]shfs .*:/shared' >/dev/null 2>&1 && left "sshfs is still running"
pgrep -f '^ssh .*10[.]77[.]0[.][0-9]*.* -s sftp' >/dev/null 2>&1 && left "sshfs's ssh is still running"
pgrep -x sftp-server >/dev/null 2>&1 && left "an sftp-server session is still open"
# Any process of the cluster, by what it runs and by its credentials (cluster-processes.sh),
# named with its pid and command line.
processes=$(cluster_processes)
while read -r pid rest; do
  [ -n "$pid" ] && left "process $pid ${rest%%: *} (${rest#*: })"
done <<EOF
$processes
EOF
if command -v ss >/dev/null 2>&1 && ss -Htn state established 2>/dev/null \
  | awk '$3 ~ /^10[.]77[.]0[.][0-9]+:/ || $4 ~ /^10[.]77[.]0[.][0-9]+:/ {found=1} END {exit !found}'; then
  left "a connection over the private network"
fi
command -v nft >/dev/null 2>&1 && nft list table inet runcrate >/dev/null 2>&1 \
  && left "the firewall table inet runcrate"
pgrep -f '/usr/local/bin/[k]3s (server|agent)|[k]3s/data/[^/]*/bin/containerd' >/dev/null 2>&1 \
  && left "k3s is still running"
for path in /usr/local/bin/k3s /var/lib/rancher/k3s /etc/rancher/k3s /var/lib/kubelet /run/k3s; do
  [ -e "$path" ] && left "$path"
done
for link in cni0 flannel.1; do
  command -v ip >/dev/null 2>&1 && ip link show "$link" >/dev/null 2>&1 && left "interface $link"
done
command -v ip >/dev/null 2>&1 && ip link show rc0 >/dev/null 2>&1 && left "interface rc0"
for path in /shared /etc/runcrate /opt/runcrate /var/lib/runcrate /run/runcrate-agent.pid \
  /etc/systemd/system/runcrate-agent.service /etc/apt/sources.list.d/runcrate.list; do
  [ -e "$path" ] && left "$path"
done
LOGIN_HOME=$(getent passwd "$LOGIN_USER" | cut -d: -f6)
for file in "$LOGIN_HOME/.ssh/authorized_keys" "$LOGIN_HOME/.ssh/config" /etc/hosts \
  /etc/environment /etc/ssh/ssh_known_hosts /etc/exports; do
  grep -qs "^# BEGIN runcrate" "$file" && left "the runcrate block in $file"
done
[ -e "$LOGIN_HOME/.ssh/runcrate_cluster" ] && left "the cluster key in $LOGIN_HOME/.ssh"
if [ -n "$EXPECTED_HOSTNAME" ] && [ "$(hostname)" != "$EXPECTED_HOSTNAME" ]; then
  left "hostname is $(hostname), not $EXPECTED_HOSTNAME"
fi
[ "$found" = 0 ] && echo "runcrate: clean"
exit "$found"
