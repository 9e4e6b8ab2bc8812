#!/bin/sh
# Runcrate wipe: undo everything bootstrap.sh did, so the host can serve the next cluster
# (clusters/machines/ssh.py runs it on terminate, stop and failure, then verify.sh over a new
# connection). Idempotent; it never touches what sits outside the runcrate blocks (the
# operator's own key in authorized_keys stays). Usage: wipe.sh LOGIN_USER
set -u
LOGIN_USER="${1:-root}"
STATE=/var/lib/runcrate
CONF=/etc/runcrate
IFACE=rc0
BEGIN="# BEGIN runcrate"
END="# END runcrate"
say() { echo "runcrate: $*"; }

unblock() {  # remove the runcrate block from FILE, keep the rest
  [ -f "$1" ] || return 0
  grep -qx "$BEGIN" "$1" || return 0
  tmp="$1.runcrate.$$"
  awk -v b="$BEGIN" -v e="$END" '$0==b{on=1;next} $0==e{on=0;next} !on' "$1" > "$tmp"
  cat "$tmp" > "$1"; rm -f "$tmp"
  say "removed block from $1"
}

# A wipe has begun: the volume (clusters/machines/storage.py) is never synced back from here on.
rm -f "$STATE/volume-pulled"

# The agent first, so it cannot report anything half-wiped.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now runcrate-agent >/dev/null 2>&1 || true
  rm -f /etc/systemd/system/runcrate-agent.service
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
if [ -s /run/runcrate-agent.pid ]; then
  kill "$(cat /run/runcrate-agent.pid)" 2>/dev/null || true
fi
pkill -f '/opt/runcrate/[r]uncrate_agent.py' 2>/dev/null || true
pkill -f "[i]perf3 -s -B 10.77.0." 2>/dev/null || true
i=0
while pgrep -f '/opt/runcrate/[r]uncrate_agent.py' >/dev/null 2>&1 && [ $i -lt 50 ]; do
  sleep 0.1; i=$((i+1))
done
pkill -9 -f '/opt/runcrate/[r]uncrate_agent.py' 2>/dev/null || true
rm -f /run/runcrate-agent.pid /var/log/runcrate-agent.log

# Slurm and munge (install-slurm.sh): the daemons and jobs' steps, the configuration it wrote,
# the cluster's munge key, Slurm's state and logs. The packages stay, like WireGuard's.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now slurmd slurmctld munge >/dev/null 2>&1 || true
fi
for pidfile in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
  [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
done
slurm_procs='^(slurmd|slurmd-wlm|slurmctld|slurmctld-wlm|slurmstepd|munged)$'
pkill "$slurm_procs" 2>/dev/null || true
i=0
while pgrep "$slurm_procs" >/dev/null 2>&1 && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
pkill -9 "$slurm_procs" 2>/dev/null || true
for conf in /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/cgroup.conf; do
  if head -n 1 "$conf" 2>/dev/null | grep -q '^# Written by runcrate'; then
    rm -f "$conf"
    say "removed $conf"
  fi
done
rm -rf /etc/slurm/runcrate-stand-in-gpus
if [ -e /etc/munge/munge.key ]; then rm -f /etc/munge/munge.key; say "removed the munge key"; fi
rm -rf /var/lib/slurm/slurmctld/* /var/lib/slurm/slurmd/* /var/lib/munge/munged.seed
rm -f /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid /run/munge/munge.socket.2* \
  /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log /var/log/munge/munged.log

# Ray (install-ray.sh): every process of it, its session files and the virtualenv (under
# /opt/runcrate, removed below). `ray stop` first, then whatever it left.
if [ -x /opt/runcrate/ray/bin/ray ]; then
  RAY_USAGE_STATS_ENABLED=0 /opt/runcrate/ray/bin/ray stop --force >/dev/null 2>&1 || true
fi
ray_procs='/opt/runcrate/[r]ay/|[r]ay::|[r]aylet|[g]cs_server'
pkill -9 -f "$ray_procs" 2>/dev/null || true
i=0
while pgrep -f "$ray_procs" >/dev/null 2>&1 && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
rm -rf /tmp/ray
# Ray's token (install-ray.sh) and the mode in /etc/environment, a block of its own.
RAY_HOME=$(getent passwd root | cut -d: -f6)
if [ -e "${RAY_HOME:-/root}/.ray/auth_token" ]; then
  rm -f "${RAY_HOME:-/root}/.ray/auth_token"
  rmdir "${RAY_HOME:-/root}/.ray" 2>/dev/null || true
  say "removed Ray's token"
fi
if grep -qx "# BEGIN runcrate ray" /etc/environment 2>/dev/null; then
  awk '$0=="# BEGIN runcrate ray"{on=1;next} $0=="# END runcrate ray"{on=0;next} !on' \
    /etc/environment > /etc/environment.runcrate.$$
  cat /etc/environment.runcrate.$$ > /etc/environment; rm -f /etc/environment.runcrate.$$
  say "removed Ray's block from /etc/environment"
fi
[ "$(readlink /usr/local/bin/ray 2>/dev/null)" = /opt/runcrate/ray/bin/ray ] && rm -f /usr/local/bin/ray

# Kubernetes (install-kubernetes.sh): k3s and every container it ran, their mounts, network
# interfaces and iptables rules, then its files: the binary and its links, /etc/rancher,
# /var/lib/rancher, the kubelet's folder. Mounts go before any folder, so nothing is deleted
# through one (a bind mount of a folder on the same disk is not stopped by --one-file-system).
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  for unit in k3s k3s-agent; do
    if grep -qs '^# Written by runcrate' "/etc/systemd/system/$unit.service"; then
      systemctl disable --now "$unit" >/dev/null 2>&1 || true
      rm -f "/etc/systemd/system/$unit.service"
      systemctl daemon-reload >/dev/null 2>&1 || true
    fi
  done
fi
[ -x /usr/local/bin/k3s-killall.sh ] && /usr/local/bin/k3s-killall.sh >/dev/null 2>&1
k3s_tree() {  # the k3s processes, containerd's shims, and everything below them (found by
  # what they run, not by the pidfile: a stale one may name another process by now)
  pids=$( { pgrep -f '/usr/local/bin/[k]3s (server|agent)'
            pgrep -x 'k3s-server|k3s-agent'
            pgrep -f '[k]3s/data/[^/]*/bin/containerd|[c]ontainerd .*/run/k3s/containerd'
          } 2>/dev/null | sort -u)
  all=$pids
  while [ -n "$pids" ]; do
    pids=$(for pid in $pids; do pgrep -P "$pid" 2>/dev/null; done)
    all="$all $pids"
  done
  # shellcheck disable=SC2086  # one line of pids
  echo $all
}
k3s_pids=$(k3s_tree)
if [ -n "$k3s_pids" ]; then
  # Stopped first, so none restarts another while the rest are killed.
  # shellcheck disable=SC2086  # a list of pids
  kill -STOP $k3s_pids 2>/dev/null || true
  # shellcheck disable=SC2086
  kill -9 $k3s_pids 2>/dev/null || true
  i=0
  while [ -n "$(k3s_tree)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
  say "stopped k3s"
fi
k3s_mounts() {
  awk '$2 ~ "^(/run/k3s|/var/lib/kubelet|/var/lib/rancher|/run/netns/cni-)" {print $2}' \
    /proc/self/mounts 2>/dev/null | sort -r
}
for point in $(k3s_mounts); do umount -f "$point" 2>/dev/null || umount -l "$point" 2>/dev/null || true; done
if command -v ip >/dev/null 2>&1; then
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do ip netns delete "$ns"; done
  for link in $(ip -o link show master cni0 2>/dev/null | awk -F': ' '{split($2, a, "@"); print a[1]}'); do
    ip link delete "$link" 2>/dev/null || true
  done
  for link in cni0 flannel.1 flannel-v6.1 flannel-wg flannel-wg-v6 kube-ipvs0; do
    if ip link show "$link" >/dev/null 2>&1; then ip link delete "$link" && say "removed $link"; fi
  done
fi
for tables in iptables ip6tables; do
  if command -v "$tables-save" >/dev/null 2>&1 && "$tables-save" 2>/dev/null | grep -qE 'KUBE-|CNI-|FLANNEL'; then
    "$tables-save" | grep -vE 'KUBE-|CNI-|FLANNEL|flannel' | "$tables-restore" && say "removed k3s's $tables rules"
  fi
done
if [ -n "$(k3s_mounts)" ]; then
  say "failed: k3s's folders are still mounted; they are left in place"
else
  for path in /var/lib/rancher /etc/rancher /var/lib/kubelet /run/k3s /run/flannel /var/lib/cni; do
    if [ -e "$path" ]; then rm -rf --one-file-system "$path" && say "removed $path"; fi
  done
fi
for tool in kubectl crictl ctr; do
  [ "$(readlink "/usr/local/bin/$tool" 2>/dev/null)" = k3s ] && rm -f "/usr/local/bin/$tool"
done
if [ -e /usr/local/bin/k3s ]; then rm -f /usr/local/bin/k3s; say "removed /usr/local/bin/k3s"; fi
rm -f /run/runcrate-k3s.pid /var/log/runcrate/k3s.log
rmdir /var/log/runcrate 2>/dev/null || true

# /shared: a worker's mount of node-0's folder is unmounted before anything is killed or
# deleted (fusermount -uz for sshfs, umount -l for NFS: lazily, so a head that is already
# unreachable cannot hang it), and nothing below crosses into another filesystem
# (rm --one-file-system), so a wipe never deletes the head's files through a mount.
if grep -qs " /shared " /proc/mounts; then
  if grep -qs " /shared nfs" /proc/mounts; then
    umount -l /shared 2>/dev/null || true
  else
    fusermount3 -uz /shared 2>/dev/null || fusermount -uz /shared 2>/dev/null \
      || umount -l /shared 2>/dev/null || true
  fi
  say "unmounted /shared"
fi
# Then every process of the cluster, by what it runs and by its credentials
# (cluster-processes.sh): sshfs and the `ssh … -oIdentityFile=…runcrate_cluster … -s sftp` it
# started, which outlives it when the head is unreachable, and anything else using the key or
# connected over the private network.
end_cluster_processes
if [ -f /etc/exports ] && grep -qx "$BEGIN" /etc/exports; then
  unblock /etc/exports
  exportfs -ra >/dev/null 2>&1 || true
fi

# The firewall (bootstrap.sh): the table is the cluster's, the operator's drop-ins
# (/etc/runcrate-firewall.d) stay.
if command -v nft >/dev/null 2>&1 && nft list table inet runcrate >/dev/null 2>&1; then
  nft delete table inet runcrate && say "removed the firewall"
fi

# The private network.
if command -v ip >/dev/null 2>&1 && ip link show "$IFACE" >/dev/null 2>&1; then
  ip link del "$IFACE" 2>/dev/null || true
  say "removed $IFACE"
fi
pkill -f "wireguard-go [r]c0" 2>/dev/null || true
rm -f "/var/run/wireguard/$IFACE.sock"

# Keys, files, folders.
LOGIN_HOME=$(getent passwd "$LOGIN_USER" | cut -d: -f6)
if [ -n "$LOGIN_HOME" ]; then
  unblock "$LOGIN_HOME/.ssh/authorized_keys"
  unblock "$LOGIN_HOME/.ssh/config"
  rm -f "$LOGIN_HOME/.ssh/runcrate_cluster" "$LOGIN_HOME/.ssh/runcrate_cluster.pub"
fi
unblock /etc/ssh/ssh_known_hosts

# Again, now that no key of the cluster opens a new session: sshfs's sftp session on node-0,
# mpirun's and users' node-to-node logins, anything that started meanwhile. Never this
# wipe's own session (it comes over the public address) nor the listening sshd.
end_cluster_processes
# An sftp-server left without its session (its sshd gone) goes too.
pkill -x sftp-server -P 1 2>/dev/null || true
unblock /etc/hosts
unblock /etc/environment
if grep -qs " /shared " /proc/mounts; then
  say "failed: /shared is still mounted; it is left in place"
else
  rm -rf --one-file-system /shared
fi
rm -rf --one-file-system /opt/runcrate "$CONF"
rm -f /etc/apt/sources.list.d/runcrate.list
[ -e "$STATE/pip-conf" ] && rm -f /etc/pip.conf

# The hostname last, from what the first bootstrap saw.
if [ -s "$STATE/original-hostname" ]; then
  original=$(cat "$STATE/original-hostname")
  echo "$original" > /etc/hostname
  hostname "$original"
  say "hostname restored to $original"
fi
rm -rf "$STATE"
say "wiped"
